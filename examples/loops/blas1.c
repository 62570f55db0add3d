/* BLAS level 1: axpy and dot products.  All loops are parallel;
 * the dot products are reductions (+ over f32/f64/i32). */
#include "kernels.h"

/* y[i] = a * x[i] + y[i] */
void EXPORT(saxpy)(int n, float a, const float *x, float *y) {
  for (int i = 0; i < n; i++)
    y[i] = a * x[i] + y[i];
}

void EXPORT(daxpy)(int n, double a, const double *x, double *y) {
  for (int i = 0; i < n; i++)
    y[i] = a * x[i] + y[i];
}

/* x[i] = a * x[i] */
void EXPORT(sscal)(int n, float a, float *x) {
  for (int i = 0; i < n; i++)
    x[i] = a * x[i];
}

/* returns sum_i x[i] * y[i] */
float EXPORT(sdot)(int n, const float *x, const float *y) {
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += x[i] * y[i];
  return s;
}

double EXPORT(ddot)(int n, const double *x, const double *y) {
  double s = 0.0;
  for (int i = 0; i < n; i++)
    s += x[i] * y[i];
  return s;
}

/* wrapping i32 arithmetic */
int EXPORT(idot)(int n, const int *x, const int *y) {
  int s = 0;
  for (int i = 0; i < n; i++)
    s += x[i] * y[i];
  return s;
}
