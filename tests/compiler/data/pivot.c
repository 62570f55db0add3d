/* Stepped loops whose child loop is split at a pivot (tests/compiler/test_pivot.py,
   compiler/analysis/fission.py's _Parts.pivot). Built with: clang-16 --target=wasm32-wasi -O2
   -nostdlib -fno-builtin -Wl,--no-entry -Wl,--export-dynamic -o pivot.wasm pivot.c */
#define N 48

int P[N][N], Q[N][N];

/* PolyBench's floyd-warshall start: edges of length 1 to 7, some 999 (no edge). */
__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      P[i][j] = i * j % 7 + 1;
      if ((i + j) % 13 == 0 || (i + j) % 7 == 0 || (i + j) % 11 == 0) P[i][j] = 999;
      Q[i][j] = (i * 5 + j * 3) % 17 - 8;
    }
}

/* The arrays' addresses, for the calls. */
__attribute__((export_name("addr"))) void *addr(int which) { return which ? (void *)Q : (void *)P; }

/* PolyBench's floyd-warshall: every row i reads row k, which only row k's own task writes;
   rows below k read it before that task, rows above after it. */
__attribute__((export_name("floyd"))) void floyd(int path[N][N]) {
  for (int k = 0; k < N; k++)
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        path[i][j] = path[i][j] < path[i][k] + path[k][j] ? path[i][j] : path[i][k] + path[k][j];
}

/* Every row reads rows k and k + 1, which two tasks write: no one task to split at. */
__attribute__((export_name("two"))) void two(int A[N][N]) {
  for (int k = 0; k < N - 1; k++)
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++) A[i][j] = (A[i][j] ^ (A[k][j] + A[k + 1][j])) & 0xffff;
}

int R[N];

/* floyd-warshall counting, per row, what its column k holds after each k: a statement
   outside the j loop, so a row is one task (no cells), split at row k. */
__attribute__((export_name("rows"))) void rows(int path[N][N], int *count) {
  for (int k = 0; k < N; k++)
    for (int i = 0; i < N; i++) {
      for (int j = 0; j < N; j++)
        path[i][j] = path[i][j] < path[i][k] + path[k][j] ? path[i][j] : path[i][k] + path[k][j];
      count[i] += path[i][k];
    }
}

/* The count's address, for the calls. */
__attribute__((export_name("counts"))) int *counts(void) { return R; }
