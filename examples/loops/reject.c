/* Loops that a parallelising compiler must NOT turn into a parallel
 * kernel as written: each has a loop-carried dependence, data-dependent
 * memory writes, an early exit, or a call with side effects. */
#include "kernels.h"

__attribute__((import_module("env"), import_name("log_value")))
void log_value(int);

/* In-place inclusive prefix sum: x[i] depends on the new x[i-1]
 * (loop-carried flow dependence). */
void EXPORT(prefix_sum)(int n, int *x) {
  for (int i = 1; i < n; i++)
    x[i] = x[i] + x[i - 1];
}

/* In-place Gauss-Seidel sweep, 5-point, rows x cols: a[i][j] reads the
 * already-updated a[i-1][j] and a[i][j-1] of the same sweep. */
void EXPORT(gauss_seidel)(int rows, int cols, float *a) {
  for (int i = 1; i < rows - 1; i++)
    for (int j = 1; j < cols - 1; j++)
      a[i * cols + j] =
          0.2f * (a[i * cols + j] + a[(i - 1) * cols + j] +
                  a[(i + 1) * cols + j] + a[i * cols + j - 1] +
                  a[i * cols + j + 1]);
}

/* Histogram: the written address bins[data[i]] depends on the data, so two
 * iterations may hit the same bin (needs atomics; not a plain map).
 * Values outside [0, nbins) are ignored. */
void EXPORT(histogram)(int n, const int *data, int nbins, int *bins) {
  for (int i = 0; i < n; i++) {
    int b = data[i];
    if (b >= 0 && b < nbins)
      bins[b] += 1;
  }
}

/* Early exit: returns the first index i with x[i] == key, or -1.  The trip
 * count depends on the data. */
int EXPORT(find_first)(int n, const int *x, int key) {
  for (int i = 0; i < n; i++)
    if (x[i] == key)
      return i;
  return -1;
}

/* Calls an imported host function on every iteration: the host call has
 * unknown side effects and an order that must be kept.  Returns the sum. */
int EXPORT(log_each)(int n, const int *x) {
  int s = 0;
  for (int i = 0; i < n; i++) {
    log_value(x[i]);
    s += x[i];
  }
  return s;
}
