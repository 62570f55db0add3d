/* Element-wise maps with conditionals: every iteration is independent
 * (parallel).  The conditionals become select / if-else in the wasm. */
#include "kernels.h"

/* y[i] = max(x[i], 0) */
void EXPORT(relu)(int n, const float *x, float *y) {
  for (int i = 0; i < n; i++)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* y[i] = min(max(x[i], lo), hi) */
void EXPORT(clamp)(int n, float lo, float hi, const float *x, float *y) {
  for (int i = 0; i < n; i++) {
    float v = x[i];
    if (v < lo)
      v = lo;
    else if (v > hi)
      v = hi;
    y[i] = v;
  }
}

/* out[i] = cond[i] ? a[i] : b[i] */
void EXPORT(select_f32)(int n, const int *cond, const float *a,
                        const float *b, float *out) {
  for (int i = 0; i < n; i++)
    out[i] = cond[i] ? a[i] : b[i];
}

/* in place: x[i] = x[i] < 0 ? -x[i] : 2 * x[i]  (i32, wrapping) */
void EXPORT(abs_or_double)(int n, int *x) {
  for (int i = 0; i < n; i++) {
    if (x[i] < 0)
      x[i] = -x[i];
    else
      x[i] = 2 * x[i];
  }
}
