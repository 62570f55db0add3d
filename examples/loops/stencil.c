/* Jacobi stencils: read one buffer, write another, so every point of a
 * sweep is independent (parallel).  Boundary points are not written. */
#include "kernels.h"

/* out[i] = (in[i-1] + in[i] + in[i+1]) / 3,  1 <= i < n-1 */
void EXPORT(jacobi1d)(int n, const float *in, float *out) {
  for (int i = 1; i < n - 1; i++)
    out[i] = (in[i - 1] + in[i] + in[i + 1]) * (1.0f / 3.0f);
}

/* 5-point, rows x cols row-major grid, interior points only */
void EXPORT(jacobi2d)(int rows, int cols, const float *in, float *out) {
  for (int i = 1; i < rows - 1; i++)
    for (int j = 1; j < cols - 1; j++)
      out[i * cols + j] =
          0.2f * (in[i * cols + j] + in[(i - 1) * cols + j] +
                  in[(i + 1) * cols + j] + in[i * cols + j - 1] +
                  in[i * cols + j + 1]);
}

/* 7-point, nx x ny x nz grid, index (x*ny + y)*nz + z, interior only */
void EXPORT(jacobi3d)(int nx, int ny, int nz, const float *in, float *out) {
  int sy = nz, sx = ny * nz;
  for (int x = 1; x < nx - 1; x++)
    for (int y = 1; y < ny - 1; y++)
      for (int z = 1; z < nz - 1; z++) {
        int c = x * sx + y * sy + z;
        out[c] = (1.0f / 7.0f) *
                 (in[c] + in[c - sx] + in[c + sx] + in[c - sy] + in[c + sy] +
                  in[c - 1] + in[c + 1]);
      }
}

/* Time-stepped 2-D Jacobi.  The outer t loop is sequential (step t+1 reads
 * what step t wrote); each sweep inside it is parallel.  a and b must both
 * hold the same boundary values.  Returns the buffer holding the result
 * (a if steps is even, b if odd). */
float *EXPORT(jacobi2d_steps)(int steps, int rows, int cols, float *a,
                              float *b) {
  for (int t = 0; t < steps; t++) {
    for (int i = 1; i < rows - 1; i++)
      for (int j = 1; j < cols - 1; j++)
        b[i * cols + j] =
            0.2f * (a[i * cols + j] + a[(i - 1) * cols + j] +
                    a[(i + 1) * cols + j] + a[i * cols + j - 1] +
                    a[i * cols + j + 1]);
    float *tmp = a;
    a = b;
    b = tmp;
  }
  return a;
}
