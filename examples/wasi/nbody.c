/* All-pairs N-body in double precision: each step computes every body's
 * acceleration from all n bodies (softened, so a body's pull on itself is
 * zero), then moves the bodies, writing the new positions to a second set of
 * arrays and swapping; prints a checksum of the final positions.
 * Usage: nbody [n] [steps]   (defaults 256 and 1) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned lcg_state = 2024u;
static double lcg_double(void) { /* deterministic values in [-1, 1) */
  lcg_state = lcg_state * 1103515245u + 12345u;
  return (double)((lcg_state >> 8) & 0xffff) / 32768.0 - 1.0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256;
  int steps = argc > 2 ? atoi(argv[2]) : 1;
  if (n <= 0 || n > 65536 || steps < 0) {
    fprintf(stderr, "nbody: need 1 <= n <= 65536, steps >= 0\n");
    return 1;
  }
  const double eps2 = 1e-3, dt = 1e-3;
  double *x = malloc(sizeof(double) * n), *y = malloc(sizeof(double) * n);
  double *z = malloc(sizeof(double) * n), *m = malloc(sizeof(double) * n);
  double *nx = malloc(sizeof(double) * n), *ny = malloc(sizeof(double) * n);
  double *nz = malloc(sizeof(double) * n);
  double *vx = calloc(n, sizeof(double)), *vy = calloc(n, sizeof(double));
  double *vz = calloc(n, sizeof(double));
  double *ax = malloc(sizeof(double) * n), *ay = malloc(sizeof(double) * n);
  double *az = malloc(sizeof(double) * n);
  if (!x || !y || !z || !m || !nx || !ny || !nz || !vx || !vy || !vz || !ax || !ay || !az) {
    fprintf(stderr, "nbody: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n; i++) {
    x[i] = lcg_double();
    y[i] = lcg_double();
    z[i] = lcg_double();
    m[i] = (lcg_double() + 1.0) / n; /* in [0, 2/n): total mass about 1 */
  }

  for (int t = 0; t < steps; t++) { /* sequential in t */
    for (int i = 0; i < n; i++) {   /* parallel over bodies */
      double sx = 0.0, sy = 0.0, sz = 0.0;
      for (int j = 0; j < n; j++) {
        double dx = x[j] - x[i], dy = y[j] - y[i], dz = z[j] - z[i];
        double d = dx * dx + dy * dy + dz * dz + eps2;
        double s = m[j] / (d * sqrt(d));
        sx += s * dx;
        sy += s * dy;
        sz += s * dz;
      }
      ax[i] = sx;
      ay[i] = sy;
      az[i] = sz;
    }
    for (int i = 0; i < n; i++) {
      vx[i] += dt * ax[i];
      vy[i] += dt * ay[i];
      vz[i] += dt * az[i];
      nx[i] = x[i] + dt * vx[i];
      ny[i] = y[i] + dt * vy[i];
      nz[i] = z[i] + dt * vz[i];
    }
    double *tmp = x;
    x = nx;
    nx = tmp;
    tmp = y;
    y = ny;
    ny = tmp;
    tmp = z;
    z = nz;
    nz = tmp;
  }

  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += x[i] + 2.0 * y[i] + 3.0 * z[i];
  printf("nbody n=%d steps=%d checksum=%.9f\n", n, steps, sum);
  free(x);
  free(y);
  free(z);
  free(m);
  free(nx);
  free(ny);
  free(nz);
  free(vx);
  free(vy);
  free(vz);
  free(ax);
  free(ay);
  free(az);
  return 0;
}
