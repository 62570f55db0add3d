/* BLAS level 3: naive triple-loop matrix multiply, row-major.
 * C (M x N) = A (M x K) * B (K x N).  The i and j loops are parallel
 * (each (i,j) owns C[i*N+j]); the k loop is a sum reduction. */
#include "kernels.h"

void EXPORT(sgemm)(int M, int N, int K, const float *A, const float *B,
                   float *C) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float s = 0.0f;
      for (int k = 0; k < K; k++)
        s += A[i * K + k] * B[k * N + j];
      C[i * N + j] = s;
    }
}

void EXPORT(dgemm)(int M, int N, int K, const double *A, const double *B,
                   double *C) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0.0;
      for (int k = 0; k < K; k++)
        s += A[i * K + k] * B[k * N + j];
      C[i * N + j] = s;
    }
}
