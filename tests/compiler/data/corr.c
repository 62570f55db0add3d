/* PolyBench's correlation nest (tests/compiler/test_schedule_corr.py): a triangular j loop
   with a k reduction inside each (i, j), a transposed store corr[j][i], and a statement
   before the j loop, corr[i][i] = 1, outside every inner loop.
   Built with: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry
   -Wl,--export-dynamic -o corr.wasm corr.c */
#define N 150
#define M 23

double data[N][M], corr[M][M];

__attribute__((export_name("init"))) void init(void) {
  for (int k = 0; k < N; k++)
    for (int j = 0; j < M; j++) data[k][j] = (double)((k * j + 3) % M) / N - 0.37;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < M; j++) corr[i][j] = -1.0 / (i + j + 1);
}

/* PolyBench's correlation, its last part: the upper triangle and its mirror. */
__attribute__((export_name("correlation"))) void correlation(void) {
  for (int i = 0; i < M - 1; i++) {
    corr[i][i] = 1.0;
    for (int j = i + 1; j < M; j++) {
      corr[i][j] = 0.0;
      for (int k = 0; k < N; k++) corr[i][j] += data[k][i] * data[k][j];
      corr[j][i] = corr[i][j];
    }
  }
  corr[M - 1][M - 1] = 1.0;
}

/* Every row, the last one included: its j loop is empty, and its statement still runs. */
__attribute__((export_name("corr_all"))) void corr_all(double one) {
  for (int i = 0; i < M; i++) {
    corr[i][i] = one;
    for (int j = i + 1; j < M; j++) {
      corr[i][j] = 0.0;
      for (int k = 0; k < N; k++) corr[i][j] += data[k][i] * data[k][j];
      corr[j][i] = corr[i][j];
    }
  }
}

/* Not legal to spread with the statement first: the statement after the j loop writes
   corr[i][M - 1], which the j loop reads before it in the same row. */
__attribute__((export_name("late"))) void late(double x) {
  for (int i = 0; i < M - 1; i++) {
    for (int j = i + 1; j < M - 1; j++) {
      corr[i][j] = 0.0;
      for (int k = 0; k < N; k++) corr[i][j] += data[k][j] * corr[i][M - 1];
      corr[j][i] = corr[i][j];
    }
    corr[i][M - 1] = x;
  }
}

