/* gemv: y = A x with A an n x n row-major f32 matrix; one output per row, each
 * a sequential sum over the row.  Bandwidth-bound (A is read once).
 * Usage: gemv N; prints a checksum of y. */
#include "suite.h"

__attribute__((noinline)) void kernel_gemv(int n, const float *restrict a,
                                           const float *restrict x, float *restrict y) {
  for (int i = 0; i < n; i++) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += a[i * n + j] * x[j];
    y[i] = sum;
  }
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 1024, 1, 16384);
  float *a = alloc((size_t)n * n, sizeof(float));
  float *x = alloc(n, sizeof(float));
  float *y = alloc(n, sizeof(float));
  fill_f32(a, n * n, 7u);
  fill_f32(x, n, 8u);
  kernel_gemv(n, a, x, y);
  printf("gemv n=%d checksum=%016llx y[n/2]=%.9g\n", n,
         (unsigned long long)checksum_f32(y, n), y[n / 2]);
  return 0;
}
