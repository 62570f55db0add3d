/* Wavefronts whose tasks carry a load to the next task (tests/compiler/test_rotated.py,
   compiler/analysis/fission.py's _task_reloads): clang keeps a row's first element loaded
   for the next row. Built with: clang-16 --target=wasm32-wasi -O2 -nostdlib -fno-builtin
   -Wl,--no-entry -Wl,--export-dynamic -o rotated.wasm rotated.c */
#define N 40
#define T 6

double A[N][N];
int B[N][N];

/* Distinct values with a fraction in every bit (the sums round). */
__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      A[i][j] = ((double)i * (j + 2) + 2) / N;
      B[i][j] = (i * 7 + j * 13) % 23 - 11;
    }
}

char S[N];
int C[N][N];

/* The arrays' addresses, for the calls. */
__attribute__((export_name("addr"))) void *addr(int which) {
  return which == 2 ? (void *)C : which == 3 ? (void *)S : which ? (void *)B : (void *)A;
}

/* A sequence of bases for nussinov, its table zero. */
__attribute__((export_name("bases"))) void bases(void) {
  for (int i = 0; i < N; i++) {
    S[i] = (char)((i * 7 + i / 3) % 4);
    for (int j = 0; j < N; j++) C[i][j] = 0;
  }
}

/* PolyBench's seidel-2d: row i at step t reads row i - 1 of step t and row i + 1 of step
   t - 1, so tasks (t, i) run in steps w = 2t + i; clang carries the rows' first elements. */
__attribute__((export_name("seidel"))) void seidel(int tsteps, double A[N][N]) {
  for (int t = 0; t <= tsteps - 1; t++)
    for (int i = 1; i <= N - 2; i++)
      for (int j = 1; j <= N - 2; j++)
        A[i][j] = (A[i - 1][j - 1] + A[i - 1][j] + A[i - 1][j + 1] + A[i][j - 1] + A[i][j] + A[i][j + 1] +
                   A[i + 1][j - 1] + A[i + 1][j] + A[i + 1][j + 1]) / 9.0;
}

/* The same in integers, the column 0 it carries written by each task after its row: the
   next task would reload the new value, not the one carried; no wavefront. */
__attribute__((export_name("writes"))) void writes(int tsteps, int B[N][N]) {
  for (int t = 0; t <= tsteps - 1; t++)
    for (int i = 1; i <= N - 2; i++) {
      for (int j = 1; j <= N - 2; j++)
        B[i][j] = (B[i - 1][j - 1] + B[i - 1][j] + B[i][j - 1] + B[i][j] + B[i + 1][j + 1]) & 0xfff;
      B[i][0] = B[i][0] + B[i - 1][0] + 1;
    }
}

#define match(b1, b2) (((b1) + (b2)) == 3 ? 1 : 0)
#define max_score(s1, s2) ((s1 >= s2) ? s1 : s2)

/* PolyBench's nussinov: cell (i, j) reads row i left of j and column j below i; clang
   carries the cell just stored (the next j's table[i][j - 1]) and the one loaded below it
   (as in PolyBench, where the kernel is inlined into main with its arrays apart). */
static void kernel(int n, char seq[N], int table[N][N]) {
  for (int i = n - 1; i >= 0; i--) {
    for (int j = i + 1; j < n; j++) {
      if (j - 1 >= 0) table[i][j] = max_score(table[i][j], table[i][j - 1]);
      if (i + 1 < n) table[i][j] = max_score(table[i][j], table[i + 1][j]);
      if (j - 1 >= 0 && i + 1 < n) {
        if (i < j - 1)
          table[i][j] = max_score(table[i][j], table[i + 1][j - 1] + match(seq[i], seq[j]));
        else
          table[i][j] = max_score(table[i][j], table[i + 1][j - 1]);
      }
      for (int k = i + 1; k < j; k++) table[i][j] = max_score(table[i][j], table[i][k] + table[k + 1][j]);
    }
  }
}

/* On the globals (clang then knows the arrays apart and carries both cells). */
__attribute__((export_name("nussinov"))) void nussinov(void) { kernel(N, S, C); }
