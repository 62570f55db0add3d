/* Triangular nests that clang -O2 unrolls by four or two, for the quasi-affine analysis
   (tests/compiler/test_unrolled_loops.py): the unrolled loop runs to `n & -4`, its
   remainder from there for `n & 3` iterations, both behind tests of their own, and the
   remainder starts at a merge of the unrolled loop's exit and the path around it. N x N
   doubles, N fixed at build time as PolyBench fixes its sizes.
   Build: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-all
          -Wl,--initial-memory=1048576 -o unrolled.wasm unrolled.c */

#define N 37

/* Deterministic data in an array of n x n doubles. */
void fill(int n, double *A, int seed) {
  for (int i = 0; i < n * n; i++)
    A[i] = (double)((i * seed) % 101) / 7.0;
}

/* syrk: C = alpha * A * A^T + beta * C on the lower triangle, row by row. */
void syrk(double alpha, double beta, double *C, double *A) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++)
      C[i * N + j] *= beta;
    for (int k = 0; k < N; k++)
      for (int j = 0; j <= i; j++)
        C[i * N + j] += alpha * A[i * N + k] * A[j * N + k];
  }
}

/* trmm's shape: the row's count is its index, unrolled by two, and the remainder is one
   conditional step at the mask's value. */
void strict_lower(double *A, double *B) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < i; j++)
      B[i * N + j] = A[i * N + j] * 0.5 + B[i * N + j];
}
