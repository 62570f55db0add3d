/* stencil3d: 3-D Jacobi (7-point average) on an n x n x n f32 grid over STEPS time
 * steps.  The time loop is sequential; each sweep over the interior is parallel.
 * The boundary holds its initial values (a hot face at x = 0).
 * Usage: stencil3d N STEPS; prints a checksum of the final grid. */
#include "suite.h"

__attribute__((noinline)) float *kernel_stencil3d(int n, int steps, float *restrict a,
                                                  float *restrict b) {
  int sx = n * n, sy = n;
  for (int t = 0; t < steps; t++) {
    for (int x = 1; x < n - 1; x++)
      for (int y = 1; y < n - 1; y++)
        for (int z = 1; z < n - 1; z++) {
          int c = x * sx + y * sy + z;
          b[c] = (1.0f / 7.0f) * (a[c] + a[c - sx] + a[c + sx] + a[c - sy] + a[c + sy] +
                                  a[c - 1] + a[c + 1]);
        }
    float *swap = a;
    a = b;
    b = swap;
  }
  return a;
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 64, 3, 512);
  int steps = arg_int(argc, argv, 2, "STEPS", 10, 0, 100000);
  int cells = n * n * n;
  float *a = alloc(cells, sizeof(float));
  float *b = alloc(cells, sizeof(float));
  fill_f32(a, cells, 12u);
  for (int i = 0; i < n * n; i++) a[i] = 1.0f;
  memcpy(b, a, (size_t)cells * sizeof(float));
  float *out = kernel_stencil3d(n, steps, a, b);
  printf("stencil3d n=%d steps=%d checksum=%016llx\n", n, steps,
         (unsigned long long)checksum_f32(out, cells));
  return 0;
}
