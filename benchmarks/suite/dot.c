/* dot: the f64 dot product of two vectors.  Bandwidth-bound (16 bytes per element).
 * The elements are small integers, so every partial sum is exact and any summation
 * order gives the same result: the loop is offloaded with --relaxed-float and its
 * output still equals wasmtime's bit for bit.
 * Usage: dot N; prints the dot product. */
#include "suite.h"

__attribute__((noinline)) double kernel_dot(int n, const double *restrict x,
                                            const double *restrict y) {
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += x[i] * y[i];
  return sum;
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 1 << 20, 1, 1 << 26);
  double *x = alloc(n, sizeof(double));
  double *y = alloc(n, sizeof(double));
  for (int i = 0; i < n; i++) {
    x[i] = (double)hash_small((uint32_t)i, 3u);
    y[i] = (double)hash_small((uint32_t)i, 4u);
  }
  printf("dot n=%d dot=%.1f\n", n, kernel_dot(n, x, y));
  return 0;
}
