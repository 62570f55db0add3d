/* gemm: C = A B with n x n row-major f32 matrices; one output per (i, j), each a
 * sequential sum over k.  Compute-bound (2 n^3 flops).
 * Usage: gemm N; prints a checksum of C. */
#include "suite.h"

__attribute__((noinline)) void kernel_gemm(int n, const float *restrict a,
                                           const float *restrict b, float *restrict c) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      float sum = 0.0f;
      for (int k = 0; k < n; k++) sum += a[i * n + k] * b[k * n + j];
      c[i * n + j] = sum;
    }
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 256, 1, 4096);
  float *a = alloc((size_t)n * n, sizeof(float));
  float *b = alloc((size_t)n * n, sizeof(float));
  float *c = alloc((size_t)n * n, sizeof(float));
  fill_f32(a, n * n, 9u);
  fill_f32(b, n * n, 10u);
  kernel_gemm(n, a, b, c);
  printf("gemm n=%d checksum=%016llx c[n*n/2]=%.9g\n", n,
         (unsigned long long)checksum_f32(c, n * n), c[n * n / 2]);
  return 0;
}
