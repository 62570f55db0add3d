/* Loop nests for the tiling tests (tests/compiler/test_tile.py): gemm-shaped ones the
 * tiler accepts, and near misses it refuses with a reason.  Pointers are i32 offsets into
 * the exported memory.  Build: clang-16 --target=wasm32 -O2 -fno-vectorize -fno-slp-vectorize -nostdlib
 *   -Wl,--no-entry -Wl,--export-memory -o nests.O2.wasm nests.c (see build.sh). */
#define EXPORT(name) __attribute__((export_name(#name))) name

/* C = alpha * A B + beta * C, the scaling as the source writes it. */
void EXPORT(gemm_ab)(int m, int n, int p, float alpha, float beta, const float *restrict a,
                     const float *restrict b, float *restrict c) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int k = 0; k < p; k++) s += a[i * p + k] * b[k * n + j];
      c[i * n + j] = alpha * s + beta * c[i * n + j];
    }
}

/* syrk-like: C = A A^T, both operands rows of A. */
void EXPORT(syrk)(int n, int p, const double *restrict a, double *restrict c) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      double s = 1.0;
      for (int k = 0; k < p; k++) s = s + a[i * p + k] * a[j * p + k];
      c[i * n + j] = s;
    }
}

/* Integer gemm with a product and a xor per step: any body, not only a sum. */
void EXPORT(imix)(int m, int n, int p, const int *restrict a, const int *restrict b,
                  int *restrict c) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      int s = 7;
      for (int k = 0; k < p; k++) s = (s * 3) ^ (a[i * p + k] + b[k * n + j]);
      c[i * n + j] = s;
    }
}

/* Near miss: the inner loop reads an element that follows both i and j (A[i][j][k]). */
void EXPORT(skew)(int n, int p, const float *restrict a, const float *restrict b,
                  float *restrict c) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int k = 0; k < p; k++) s += a[(i * n + j) * p + k] * b[k * n + j];
      c[i * n + j] = s;
    }
}

/* Near miss: the sum stays in memory, a store in every step of the inner loop. */
void EXPORT(inplace)(int n, int p, const float *a, const float *b, float *c) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      for (int k = 0; k < p; k++) c[i * n + j] += a[i * p + k] * b[k * n + j];
}

/* 1-D: one row per thread, the inner loop along the row (gemv). */
void EXPORT(gemv_rows)(int m, int p, const float *restrict a, const float *restrict x,
                       float *restrict y) {
  for (int i = 0; i < m; i++) {
    float s = 0.0f;
    for (int k = 0; k < p; k++) s += a[i * p + k] * x[k];
    y[i] = s;
  }
}

/* 1-D, f64: two rows of the same matrix, a scaling after the loop. */
void EXPORT(dmv_rows)(int m, int p, double alpha, const double *restrict a,
                      const double *restrict x, double *restrict y) {
  for (int i = 0; i < m; i++) {
    double s = 0.0, t = 1.0;
    for (int k = 0; k < p; k++) {
      s = s + a[i * p + k] * x[k];
      t = t * 0.5 + a[i * p + k];
    }
    y[i] = alpha * s - t;
  }
}

/* 1-D, integers: rows of two matrices, no load shared by the rows. */
void EXPORT(irows)(int m, int p, const int *restrict a, const int *restrict b, int *restrict c) {
  for (int i = 0; i < m; i++) {
    int s = 7;
    for (int k = 0; k < p; k++) s = (s * 3) ^ (a[i * p + k] + b[i * p + k]);
    c[i] = s;
  }
}

/* Near miss, 1-D: the inner loop walks down a column (A^T x). */
void EXPORT(gemv_cols)(int m, int p, const float *restrict a, const float *restrict x,
                       float *restrict y) {
  for (int i = 0; i < m; i++) {
    float s = 0.0f;
    for (int k = 0; k < p; k++) s += a[k * m + i] * x[k];
    y[i] = s;
  }
}
