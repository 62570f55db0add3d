/* Imperfect nests for loop distribution and interchange (tests/compiler/test_schedule.py).
   Built with: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-dynamic
   -o distribute.wasm distribute.c */
#define NI 20
#define NJ 60
#define NK 40

double C[NI][NJ], A[NI][NK], B[NK][NJ], T[NI][NJ];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) C[i][j] = (double)((i * j + 1) % NI) / NI;
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++) A[i][k] = (double)(i * (k + 1) % NK) / NK;
  for (int k = 0; k < NK; k++)
    for (int j = 0; j < NJ; j++) B[k][j] = (double)(k * (j + 2) % NJ) / NJ;
}

/* PolyBench's gemm: C *= beta, then C += alpha * A * B with k outside j. */
__attribute__((export_name("gemm"))) void gemm(double alpha, double beta) {
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++) C[i][j] *= beta;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++) C[i][j] += alpha * A[i][k] * B[k][j];
  }
}

/* The same through pointers: the arrays may overlap, which only the guards can see. */
__attribute__((export_name("gemm_ptr")))
void gemm_ptr(double (*c)[NJ], double (*a)[NJ], double (*b)[NJ], double alpha, double beta) {
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++) c[i][j] *= beta;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++) c[i][j] += alpha * a[i][k] * b[k][j];
  }
}

/* Interchange alone: T[i][j] gathers over k in order. */
__attribute__((export_name("inter"))) void inter(double alpha) {
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++) T[i][j] = T[i][j] * alpha + A[i][k] * B[k][j];
}

/* Interchange alone, over a triangular row: T[i][j] for j <= i gathers over k in order (not
   unrolled: clang's remainder loops of an unrolled triangular loop are not modelled yet). */
__attribute__((export_name("tri"))) void tri(double alpha) {
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++)
#pragma clang loop unroll(disable) vectorize(disable)
      for (int j = 0; j <= i; j++) T[i][j] = T[i][j] * alpha + A[i][k] * B[k][j];
}

/* Not legal: every k step reads C[i][k], which the j loop of the same row writes. */
__attribute__((export_name("self_ref"))) void self_ref(double alpha) {
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++) C[i][j] += alpha * C[i][k] * B[k][j];
}

/* The arrays' addresses, for calls through gemm_ptr: 0 C, 1 A, 2 B. */
__attribute__((export_name("addr"))) int addr(int which) {
  return which == 0 ? (int)C : which == 1 ? (int)A : (int)B;
}
