/* saxpy: y = a*x + y over f32 vectors, repeated for REPS passes.
 * Bandwidth-bound: each pass reads x and y and writes y (12 bytes per element).
 * Usage: saxpy N [REPS]   (REPS defaults to 1); prints a checksum of y. */
#include "suite.h"

__attribute__((noinline)) void kernel_saxpy(int n, float a, const float *restrict x,
                                            float *restrict y) {
  for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 1 << 20, 1, 1 << 27);
  int reps = arg_int(argc, argv, 2, "REPS", 1, 0, 1000);
  float *x = alloc(n, sizeof(float));
  float *y = alloc(n, sizeof(float));
  fill_f32(x, n, 1u);
  fill_f32(y, n, 2u);
  for (int r = 0; r < reps; r++) kernel_saxpy(n, 1.5f, x, y);
  printf("saxpy n=%d reps=%d checksum=%016llx y[n/2]=%.9g\n", n, reps,
         (unsigned long long)checksum_f32(y, n), y[n / 2]);
  return 0;
}
