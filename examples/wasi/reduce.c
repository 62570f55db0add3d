/* Sum, min and max of an i32 array and sum of an f64 array; prints them.
 * Usage: reduce [n]   (default 100000) */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  if (n <= 0 || n > 16 * 1024 * 1024) {
    fprintf(stderr, "reduce: n must be in 1..16777216\n");
    return 1;
  }
  int *x = malloc(sizeof(int) * n);
  double *d = malloc(sizeof(double) * n);
  if (!x || !d) {
    fprintf(stderr, "reduce: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n; i++) {
    x[i] = (int)((i * 2654435761u) >> 16) % 1000 - 500;
    d[i] = 1.0 / (double)(i + 1);
  }

  long long isum = 0;
  int imin = x[0], imax = x[0];
  double dsum = 0.0;
  for (int i = 0; i < n; i++) {
    isum += x[i];
    if (x[i] < imin) imin = x[i];
    if (x[i] > imax) imax = x[i];
  }
  for (int i = 0; i < n; i++) dsum += d[i];

  printf("reduce n=%d isum=%lld imin=%d imax=%d dsum=%.9f\n", n, isum, imin,
         imax, dsum);
  free(x);
  free(d);
  return 0;
}
