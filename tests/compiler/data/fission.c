/* Sequential loops whose bodies split into phases that each run in parallel
   (tests/compiler/test_fission.py, compiler/analysis/fission.py). Built with: clang-16
   --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-dynamic -o fission.wasm
   fission.c */
#define M 38
#define N 42

double A[M][N], x[N], y[N], tmp[M], s[N], q[M], p[N], r[M], v[N];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) A[i][j] = (double)((i * j + 1) % N) / N - 0.25;
  for (int j = 0; j < N; j++) {
    x[j] = 1.0 + j / 3.0;
    p[j] = (double)(j % 7) - 2.5;
    v[j] = 0.5 / (j + 1);
  }
  for (int i = 0; i < M; i++) r[i] = (double)(i % 5) * 0.125 + 1.0;
}

/* PolyBench's atax, its arrays passed as pointers (apart only by the guards): tmp whole
   per row, then y over j with the rows in order inside each thread. */
__attribute__((export_name("atax"))) void atax(double A[M][N], double *x, double *y, double *tmp) {
  for (int i = 0; i < N; i++) y[i] = 0;
  for (int i = 0; i < M; i++) {
    tmp[i] = 0.0;
    for (int j = 0; j < N; j++) tmp[i] = tmp[i] + A[i][j] * x[j];
    for (int j = 0; j < N; j++) y[j] = y[j] + A[i][j] * tmp[i];
  }
}

/* The arrays' addresses, for the calls. */
__attribute__((export_name("addr"))) void *addr(int which) {
  void *all[] = {A, x, y, tmp, s, q, p, r, v};
  return all[which];
}

/* PolyBench's bicg on the globals: both updates in one j loop, split by their stores. */
__attribute__((export_name("bicg"))) void bicg(double A[M][N], double *s, double *q, double *p, double *r) {
  for (int i = 0; i < N; i++) s[i] = 0;
  for (int i = 0; i < M; i++) {
    q[i] = 0.0;
    for (int j = 0; j < N; j++) {
      s[j] = s[j] + r[i] * A[i][j];
      q[i] = q[i] + A[i][j] * p[j];
    }
  }
}

/* A time loop over one parallel loop: each thread runs every step in order for its j. */
__attribute__((export_name("steps"))) void steps(double *v, double *x) {
  for (int k = 0; k < 50; k++)
    for (int j = 0; j < N; j++) v[j] = v[j] * 0.75 + x[j];
}

/* Not splittable: the statement reads y[i], which the j loop of earlier rows wrote. */
__attribute__((export_name("carried"))) void carried(double A[M][N], double *y, double *tmp) {
  for (int i = 0; i < M; i++) {
    tmp[i] = y[i] * 0.5;
    for (int j = 0; j < N; j++) y[j] = y[j] + A[i][j] * tmp[i];
  }
}
