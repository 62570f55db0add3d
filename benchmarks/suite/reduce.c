/* reduce: sum (as i64), minimum and maximum of an i32 vector in one pass.
 * Bandwidth-bound (4 bytes per element); integer reductions, exact in any order.
 * Usage: reduce N; prints the three results. */
#include "suite.h"

__attribute__((noinline)) void kernel_reduce(int n, const int *restrict x,
                                             long long *sum, int *min, int *max) {
  long long s = 0;
  int lo = x[0], hi = x[0];
  for (int i = 0; i < n; i++) {
    s += x[i];
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  *sum = s;
  *min = lo;
  *max = hi;
}

int main(int argc, char **argv) {
  int n = arg_int(argc, argv, 1, "N", 1 << 20, 1, 1 << 28);
  int *x = alloc(n, sizeof(int));
  for (int i = 0; i < n; i++) {
    uint32_t h = (uint32_t)i * 2654435761u + 5u;
    x[i] = (int)((h ^ (h >> 15)) % 2000001u) - 1000000;
  }
  long long sum;
  int min, max;
  kernel_reduce(n, x, &sum, &min, &max);
  printf("reduce n=%d sum=%lld min=%d max=%d\n", n, sum, min, max);
  return 0;
}
