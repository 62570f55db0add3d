/* Histogram of pseudo-random values, then an in-place prefix sum over the
 * bins (cumulative counts).  Both loops must stay sequential: the histogram
 * writes to data-dependent addresses and the prefix sum carries a
 * dependence from one iteration to the next.
 * Usage: histogram [n] [nbins]   (defaults 100000 and 64) */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  int nbins = argc > 2 ? atoi(argv[2]) : 64;
  if (n <= 0 || n > 16 * 1024 * 1024 || nbins <= 0 || nbins > 65536) {
    fprintf(stderr, "histogram: need 1 <= n <= 16777216, 1 <= nbins <= 65536\n");
    return 1;
  }
  int *data = malloc(sizeof(int) * n);
  int *bins = calloc(nbins, sizeof(int));
  if (!data || !bins) {
    fprintf(stderr, "histogram: out of memory\n");
    return 1;
  }
  unsigned s = 2463534242u; /* xorshift32 */
  for (int i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    data[i] = (int)(s % (unsigned)nbins);
  }

  for (int i = 0; i < n; i++) bins[data[i]]++;
  for (int b = 1; b < nbins; b++) bins[b] += bins[b - 1];

  unsigned check = 0;
  for (int b = 0; b < nbins; b++) check = check * 31u + (unsigned)bins[b];
  printf("histogram n=%d nbins=%d total=%d check=%u\n", n, nbins,
         bins[nbins - 1], check);
  free(data);
  free(bins);
  return 0;
}
