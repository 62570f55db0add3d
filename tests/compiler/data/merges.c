/* Loops that start from a merge of two values chosen by a loop-invariant test
   (tests/compiler/test_merges.py): the scalar remainder after a vectorised inner loop
   starts at 1 when the row is too short for the vector loop and where the vector loop
   stopped otherwise; trmm's inner loop, unrolled by two, starts at `i` or `i + 1` as one
   step is peeled when `(1 - i) & 1` is set; symm's initialisation fills the upper
   triangle by a loop unrolled by eight behind a join of its peeled steps and the path
   around them, its entry test before that join.
   Build: clang-16 --target=wasm32-wasi -O2 -msimd128 -nostdlib -Wl,--no-entry
          -Wl,--export-all -Wl,--initial-memory=1048576 -o merges.wasm merges.c */

#define M 37
#define N 24

/* Deterministic data in an array of n floats. */
void fill(int n, float *a, int seed) {
  for (int i = 0; i < n; i++)
    a[i] = (float)((i * seed) % 101) / 7.0f;
}

/* One sweep of a 2-D stencil over an n x m grid (interior points): the inner loop is
   vectorised, with a scalar remainder. */
void sweep(float *restrict b, const float *restrict a, int n, int m) {
  for (int i = 1; i < n - 1; i++)
    for (int j = 1; j < m - 1; j++)
      b[i * m + j] = 0.25f * (a[i * m + j - 1] + a[i * m + j + 1] + a[(i - 1) * m + j] +
                              a[(i + 1) * m + j]);
}

/* trmm: B = alpha * A^T * B with A unit lower triangular, M x M and M x N doubles. */
void trmm(double alpha, double *A, double *B) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      for (int k = i + 1; k < M; k++)
        B[i * N + j] += A[k * M + i] * B[k * N + j];
      B[i * N + j] = alpha * B[i * N + j];
    }
}

/* Deterministic data in an array of n doubles. */
void filld(int n, double *a, int seed) {
  for (int i = 0; i < n; i++)
    a[i] = (double)((i * seed) % 101) / 7.0;
}

/* symm's initialisation of the upper triangle: A[i][j] = -999 for j > i, M x M doubles. */
void upper(double *A) {
  for (int i = 0; i < M; i++)
    for (int j = i + 1; j < M; j++)
      A[i * M + j] = -999;
}
