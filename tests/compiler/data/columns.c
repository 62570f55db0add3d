/* Column updates of row-major matrices from a loop over the columns, as PolyBench's
   gramschmidt writes them (tests/compiler/test_column_guards.py): iteration j touches
   column j only, one element per row, so the columns of different iterations interleave in
   memory without sharing an element. Built with: clang-16 --target=wasm32-wasi -O2
   -nostdlib -Wl,--no-entry -Wl,--export-dynamic -o columns.wasm columns.c */
#define M 40
#define N 24

double A[M][N], Q[M][N], R[N][N];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) A[i][j] = (double)((i * j + 3) % M) / N + (i == j);
}

/* PolyBench's gramschmidt: the j loop updates column j of A from column k of Q. */
__attribute__((export_name("gramschmidt"))) void gramschmidt(void) {
  for (int k = 0; k < N; k++) {
    double nrm = 0.0;
    for (int i = 0; i < M; i++) nrm += A[i][k] * A[i][k];
    R[k][k] = __builtin_sqrt(nrm);
    for (int i = 0; i < M; i++) Q[i][k] = A[i][k] / R[k][k];
    for (int j = k + 1; j < N; j++) {
      R[k][j] = 0.0;
      for (int i = 0; i < M; i++) R[k][j] += Q[i][k] * A[i][j];
      for (int i = 0; i < M; i++) A[i][j] = A[i][j] - Q[i][k] * R[k][j];
    }
  }
}

/* One column update through pointers, as a kernel function sees its arrays: whether the
   columns of a and q meet is decided at run time. */
__attribute__((export_name("update"))) void update(int k, double (*a)[N], double (*q)[N]) {
  for (int j = k + 1; j < N; j++) {
    double s = 0.0;
    for (int i = 0; i < M; i++) s += q[i][k] * a[i][j];
    for (int i = 0; i < M; i++) a[i][j] = a[i][j] - q[i][k] * s;
  }
}

/* Not independent: iteration j writes columns j and j + 1, so neighbouring iterations
   share column j + 1. */
__attribute__((export_name("pairs"))) void pairs(double s) {
  for (int j = 0; j < N - 1; j++) {
    for (int i = 0; i < M; i++) A[i][j] = A[i][j] + s;
    for (int i = 0; i < M; i++) A[i][j + 1] = A[i][j + 1] * s;
  }
}

/* The arrays' addresses, for calls through update: 0 A, 1 Q. */
__attribute__((export_name("addr"))) int addr(int which) { return which == 0 ? (int)A : (int)Q; }
