/* Small dense matrix multiply C = A * B (n x n, f32), prints a checksum.
 * Usage: matmul [n]   (default 64) */
#include <stdio.h>
#include <stdlib.h>

static unsigned lcg_state = 12345u;
static float lcg_float(void) { /* deterministic values in [-1, 1) */
  lcg_state = lcg_state * 1103515245u + 12345u;
  return (float)((lcg_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64;
  if (n <= 0 || n > 2048) {
    fprintf(stderr, "matmul: n must be in 1..2048\n");
    return 1;
  }
  float *A = malloc(sizeof(float) * n * n);
  float *B = malloc(sizeof(float) * n * n);
  float *C = malloc(sizeof(float) * n * n);
  if (!A || !B || !C) {
    fprintf(stderr, "matmul: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n * n; i++) A[i] = lcg_float();
  for (int i = 0; i < n * n; i++) B[i] = lcg_float();

  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int k = 0; k < n; k++)
        s += A[i * n + k] * B[k * n + j];
      C[i * n + j] = s;
    }

  double sum = 0.0;
  for (int i = 0; i < n * n; i++) sum += C[i];
  printf("matmul n=%d checksum=%.6f\n", n, sum);
  free(A);
  free(B);
  free(C);
  return 0;
}
