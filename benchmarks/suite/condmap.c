/* condmap: an f32 map whose value depends on a condition per element:
 * y = sqrt(x) * 2 where x > 0, else x * x - 0.25.  Bandwidth-bound (8 bytes per element).
 * Usage: condmap N [REPS]   (REPS defaults to 1); prints a checksum of y. */
#include <math.h>

#include "suite.h"

__attribute__((noinline)) void kernel_condmap(int n, const float *restrict x,
                                              float *restrict y) {
  for (int i = 0; i < n; i++) {
    if (x[i] > 0.0f)
      y[i] = sqrtf(x[i]) * 2.0f;
    else
      y[i] = x[i] * x[i] - 0.25f;
  }
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 1 << 20, 1, 1 << 27);
  int reps = arg_int(argc, argv, 2, "REPS", 1, 0, 1000);
  float *x = alloc(n, sizeof(float));
  float *y = alloc(n, sizeof(float));
  fill_f32(x, n, 6u);
  for (int r = 0; r < reps; r++) kernel_condmap(n, x, y);
  printf("condmap n=%d reps=%d checksum=%016llx y[n/2]=%.9g\n", n, reps,
         (unsigned long long)checksum_f32(y, n), y[n / 2]);
  return 0;
}
