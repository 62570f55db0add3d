/* Sequential loops run as one launch whose iterations run in order, each running its
   phases in turn (tests/compiler/test_stepped.py, compiler/analysis/fission.py's
   split_stepped). Built with: clang-16 --target=wasm32-wasi -O2 -nostdlib -fno-builtin
   -Wl,--no-entry -Wl,--export-dynamic -o stepped.wasm stepped.c */
#define M 40
#define N 36

double A[M][N], Q[M][N], R[N][N];

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) A[i][j] = (double)((i * j + 3) % 11) / 7.0 + (i == j ? 4.0 : 0.5);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) R[i][j] = -1.0;
}

/* The arrays' addresses, for the calls. */
__attribute__((export_name("addr"))) void *addr(int which) {
  void *all[] = {A, Q, R};
  return all[which];
}

/* PolyBench's gramschmidt: in each k, one thread sums the column's squares in order and
   sets R[k][k]; Q's column runs over i; R's row and A's columns over j. */
__attribute__((export_name("gramschmidt"))) void gramschmidt(double A[M][N], double R[N][N], double Q[M][N]) {
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

/* Not stepped: the column loop, run over the grid, divides by the sum the loop before it
   made (a value of that loop, which its phase skips). */
__attribute__((export_name("unstepped"))) void unstepped(double A[M][N], double Q[M][N]) {
  for (int k = 0; k < N; k++) {
    double nrm = 0.0;
    for (int i = 0; i < M; i++) nrm += A[i][k] * A[i][k];
    for (int i = 0; i < M; i++) Q[i][k] = A[i][k] / nrm;
    for (int j = k + 1; j < N; j++)
      for (int i = 0; i < M; i++) A[i][j] = A[i][j] - Q[i][k] * A[i][k];
  }
}

/* gramschmidt whose column update multiplies by the sum itself, not R[k][j] read back: a
   value of the sum's loop read after it, so the j loop's two i loops stay in one phase. */
__attribute__((export_name("held"))) void held(double A[M][N], double R[N][N], double Q[M][N]) {
  for (int k = 0; k < N; k++) {
    double nrm = 0.0;
    for (int i = 0; i < M; i++) nrm += A[i][k] * A[i][k];
    R[k][k] = __builtin_sqrt(nrm);
    for (int i = 0; i < M; i++) Q[i][k] = A[i][k] / R[k][k];
    for (int j = k + 1; j < N; j++) {
      double s = 0.0;
      for (int i = 0; i < M; i++) s += Q[i][k] * A[i][j];
      R[k][j] = s;
      for (int i = 0; i < M; i++) A[i][j] = A[i][j] - Q[i][k] * s;
    }
  }
}

/* gramschmidt whose column update also keeps its last element in T[j], which every i
   writes: split from the sums, its cells (one per i) would race for T[j], so the j loop's
   two i loops stay in one phase. */
double T[N];

__attribute__((export_name("chained"))) void chained(double A[M][N], double R[N][N], double Q[M][N]) {
  for (int k = 0; k < N; k++) {
    double nrm = 0.0;
    for (int i = 0; i < M; i++) nrm += A[i][k] * A[i][k];
    R[k][k] = __builtin_sqrt(nrm);
    for (int i = 0; i < M; i++) Q[i][k] = A[i][k] / R[k][k];
    for (int j = k + 1; j < N; j++) {
      R[k][j] = 0.0;
      for (int i = 0; i < M; i++) R[k][j] += Q[i][k] * A[i][j];
      for (int i = 0; i < M; i++) {
        A[i][j] = A[i][j] - Q[i][k] * R[k][j];
        T[j] = A[i][j];
      }
    }
  }
}
