/* stencil2d: 2-D Jacobi (5-point average) on an n x n f32 grid over STEPS time
 * steps.  The time loop is sequential; each sweep over the interior is parallel.
 * The boundary holds its initial values (a hot top edge).
 * Usage: stencil2d N STEPS; prints a checksum of the final grid. */
#include "suite.h"

__attribute__((noinline)) float *kernel_stencil2d(int n, int steps, float *restrict a,
                                                  float *restrict b) {
  for (int t = 0; t < steps; t++) {
    for (int i = 1; i < n - 1; i++)
      for (int j = 1; j < n - 1; j++)
        b[i * n + j] = 0.2f * (a[i * n + j] + a[(i - 1) * n + j] + a[(i + 1) * n + j] +
                               a[i * n + j - 1] + a[i * n + j + 1]);
    float *swap = a;
    a = b;
    b = swap;
  }
  return a;
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 256, 3, 16384);
  int steps = arg_int(argc, argv, 2, "STEPS", 10, 0, 100000);
  float *a = alloc((size_t)n * n, sizeof(float));
  float *b = alloc((size_t)n * n, sizeof(float));
  fill_f32(a, n * n, 11u);
  for (int j = 0; j < n; j++) a[j] = 1.0f;
  memcpy(b, a, (size_t)n * n * sizeof(float));
  float *out = kernel_stencil2d(n, steps, a, b);
  printf("stencil2d n=%d steps=%d checksum=%016llx\n", n, steps,
         (unsigned long long)checksum_f32(out, n * n));
  return 0;
}
