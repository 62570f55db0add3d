/* Stepped loops whose serial work runs in child loops, run as wavefronts
   (tests/compiler/test_wavefront.py, compiler/analysis/fission.py's split_wavefront). Built
   with: clang-16 --target=wasm32-wasi -O2 -nostdlib -fno-builtin -Wl,--no-entry
   -Wl,--export-dynamic -o wavefront.wasm wavefront.c */
#define N 40

double A[N][N], B[N][N];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      A[i][j] = (double)((i * j + 3) % 11) / 7.0 + (i == j ? N : 0.5);
      B[i][j] = -1.0;
    }
}

/* The arrays' addresses, for the calls. */
__attribute__((export_name("addr"))) void *addr(int which) { return which ? (void *)B : (void *)A; }

/* PolyBench's lu: row i's part left of the diagonal is a triangular solve in j, the rest a
   dot product per j; a task (i, j) runs in step i + j. PolyBench's sizes are
   numbers, as N here. */
__attribute__((export_name("lu"))) void lu(double A[N][N]) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < i; j++) {
      for (int k = 0; k < j; k++) A[i][j] -= A[i][k] * A[k][j];
      A[i][j] /= A[j][j];
    }
    for (int j = i; j < N; j++)
      for (int k = 0; k < i; k++) A[i][j] -= A[i][k] * A[k][j];
  }
}
