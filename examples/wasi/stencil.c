/* 2-D heat equation (5-point Jacobi) over time steps on an n x n grid with a
 * fixed hot top edge; prints a checksum of the final grid.
 * Usage: stencil [n] [steps]   (defaults 64 and 50) */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64;
  int steps = argc > 2 ? atoi(argv[2]) : 50;
  if (n < 3 || n > 4096 || steps < 0) {
    fprintf(stderr, "stencil: need 3 <= n <= 4096, steps >= 0\n");
    return 1;
  }
  float *a = calloc((size_t)n * n, sizeof(float));
  float *b = calloc((size_t)n * n, sizeof(float));
  if (!a || !b) {
    fprintf(stderr, "stencil: out of memory\n");
    return 1;
  }
  for (int j = 0; j < n; j++) a[j] = b[j] = 100.0f; /* hot top row */

  for (int t = 0; t < steps; t++) { /* sequential in t */
    for (int i = 1; i < n - 1; i++) /* parallel sweep */
      for (int j = 1; j < n - 1; j++)
        b[i * n + j] = 0.2f * (a[i * n + j] + a[(i - 1) * n + j] +
                               a[(i + 1) * n + j] + a[i * n + j - 1] +
                               a[i * n + j + 1]);
    float *tmp = a;
    a = b;
    b = tmp;
  }

  double sum = 0.0;
  for (int i = 0; i < n * n; i++) sum += a[i];
  printf("stencil n=%d steps=%d checksum=%.6f\n", n, steps, sum);
  free(a);
  free(b);
  return 0;
}
