/* Reductions: parallel with a tree/atomic combine.  Integer sum/min/max/xor
 * are associative and commutative, so any order gives the same result.
 * fsum is float addition: a parallel version reassociates and may differ in
 * the last bits from this sequential order. */
#include "kernels.h"

int EXPORT(isum)(int n, const int *x) {
  int s = 0;
  for (int i = 0; i < n; i++)
    s += x[i];
  return s;
}

/* returns INT_MAX for n <= 0 */
int EXPORT(imin)(int n, const int *x) {
  int m = 0x7fffffff;
  for (int i = 0; i < n; i++)
    if (x[i] < m)
      m = x[i];
  return m;
}

/* returns INT_MIN for n <= 0 */
int EXPORT(imax)(int n, const int *x) {
  int m = -0x7fffffff - 1;
  for (int i = 0; i < n; i++)
    if (x[i] > m)
      m = x[i];
  return m;
}

int EXPORT(ixor)(int n, const int *x) {
  int s = 0;
  for (int i = 0; i < n; i++)
    s ^= x[i];
  return s;
}

float EXPORT(fsum)(int n, const float *x) {
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += x[i];
  return s;
}

double EXPORT(dsum)(int n, const double *x) {
  double s = 0.0;
  for (int i = 0; i < n; i++)
    s += x[i];
  return s;
}
