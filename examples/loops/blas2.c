/* BLAS level 2: matrix-vector product, row-major A (m rows, n cols).
 * The outer i loop is parallel (each i owns y[i]); the inner j loop is a
 * sum reduction. */
#include "kernels.h"

/* y = alpha * A x + beta * y */
void EXPORT(sgemv)(int m, int n, float alpha, const float *A, const float *x,
                   float beta, float *y) {
  for (int i = 0; i < m; i++) {
    float s = 0.0f;
    for (int j = 0; j < n; j++)
      s += A[i * n + j] * x[j];
    y[i] = alpha * s + beta * y[i];
  }
}

void EXPORT(dgemv)(int m, int n, double alpha, const double *A,
                   const double *x, double beta, double *y) {
  for (int i = 0; i < m; i++) {
    double s = 0.0;
    for (int j = 0; j < n; j++)
      s += A[i * n + j] * x[j];
    y[i] = alpha * s + beta * y[i];
  }
}
