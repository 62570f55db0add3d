/* Loop nests shaped like PolyBench's kernels, for the loop analysis tests
   (tests/compiler/test_poly_loops.py): arrays come in as pointers, N x N doubles each, N
   fixed at build time as PolyBench fixes its sizes (an address n*i + j with n a run-time
   value is no affine function of the counters).
   clang -O2 unrolls inner loops by two with a remainder whose bounds are bit masks of the
   outer counter, which the analysis does not model yet: the inner loops keep their shape.
   Build: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-all
          -Wl,--initial-memory=1048576 -o nests.wasm nests.c */

#define N 40

/* Deterministic data in an array of n x n doubles. */
void fill(int n, double *A, int seed) {
  for (int i = 0; i < n * n; i++)
    A[i] = (double)((i * seed) % 101) / 7.0;
}

/* covariance's symmetric fill: row i writes C[i][j] and C[j][i] for j >= i (triangular). */
void symmetric(double *A, double *C) {
  for (int i = 0; i < N; i++)
#pragma clang loop unroll(disable)
    for (int j = i; j < N; j++) {
      double s = 0.0;
#pragma clang loop unroll(disable)
      for (int k = 0; k < N; k++)
        s += A[k * N + i] * A[k * N + j];
      C[i * N + j] = s;
      C[j * N + i] = s;
    }
}

/* A lower triangle updated row by row: the inner bound moves with the row. */
void lower(double beta, double *A, double *B) {
  for (int i = 0; i < N; i++)
#pragma clang loop unroll(disable)
    for (int j = 0; j < i; j++)
      B[i * N + j] = B[i * N + j] * beta + A[j * N + i];
}

/* jacobi-1d: a time loop whose every step writes the same elements. */
void jacobi(int steps, int n, double *A, double *B) {
  for (int t = 0; t < steps; t++) {
#pragma clang loop unroll(disable)
    for (int i = 1; i < n - 1; i++)
      B[i] = 0.33333 * (A[i - 1] + A[i] + A[i + 1]);
#pragma clang loop unroll(disable)
    for (int i = 1; i < n - 1; i++)
      A[i] = 0.33333 * (B[i - 1] + B[i] + B[i + 1]);
  }
}
