/* Triangular imperfect nests as clang -O2 unrolls them: PolyBench's syrk and syr2k
   (tests/compiler/test_schedule_triangular.py). Built with: clang-16 --target=wasm32-wasi -O2
   -nostdlib -Wl,--no-entry -Wl,--export-dynamic -o syrk.wasm syrk.c */
#define N 23
#define M 17

double C[N][N], A[N][M], B[N][M];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) C[i][j] = (double)((i * j + 2) % N) / M;
  for (int i = 0; i < N; i++)
    for (int k = 0; k < M; k++) {
      A[i][k] = (double)((i * k + 1) % N) / N;
      B[i][k] = (double)((i * k + 2) % M) / M;
    }
}

/* PolyBench's syrk: the row's j loops unrolled by clang, each with its remainder. */
__attribute__((export_name("syrk"))) void syrk(double alpha, double beta) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++) C[i][j] *= beta;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++) C[i][j] += alpha * A[i][k] * A[j][k];
  }
}

/* PolyBench's syr2k. */
__attribute__((export_name("syr2k"))) void syr2k(double alpha, double beta) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++) C[i][j] *= beta;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++) C[i][j] += A[j][k] * alpha * B[i][k] + B[j][k] * alpha * A[i][k];
  }
}

/* syrk through pointers and sizes, as PolyBench's kernel function sees its arrays. */
__attribute__((export_name("syrk_ptr")))
void syrk_ptr(int n, int m, double (*c)[N], double (*a)[M], double alpha, double beta) {
  for (int i = 0; i < n; i++) {
    for (int j = 0; j <= i; j++) c[i][j] *= beta;
    for (int k = 0; k < m; k++)
      for (int j = 0; j <= i; j++) c[i][j] += alpha * a[i][k] * a[j][k];
  }
}

/* The diagonal as a statement of its own after the row's j loop: one more thread runs it. */
__attribute__((export_name("diag"))) void diag(double alpha) {
  for (int i = 0; i < N; i++)
    for (int k = 0; k < M; k++) {
#pragma clang loop unroll(disable) vectorize(disable)
      for (int j = i + 1; j < N; j++) C[i][j] += alpha * A[i][k] * A[j][k];
      C[i][i] += alpha * A[i][k] * A[i][k];
    }
}

/* Not legal to spread: every k step of the j loop reads C[i][i], which the statement after
   it writes; no thread may run ahead of the one that runs that statement. */
__attribute__((export_name("diag_read"))) void diag_read(double alpha) {
  for (int i = 0; i < N; i++)
    for (int k = 0; k < M; k++) {
#pragma clang loop unroll(disable) vectorize(disable)
      for (int j = i + 1; j < N; j++) C[i][j] += alpha * C[i][i] * A[j][k];
      C[i][i] += alpha * A[i][k];
    }
}

/* The arrays' addresses, for calls through syrk_ptr: 0 C, 1 A. */
__attribute__((export_name("addr"))) int addr(int which) { return which == 0 ? (int)C : (int)A; }
