/* symm's initialisation of the upper triangle (tests/compiler/test_merges.py), unrolled by
   clang -O2 by four after a peeled remainder: the unrolled loop sits behind a join of the
   remainder's path and the path around it, its entry tests in front of that join.
   Build: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-all
          -Wl,--initial-memory=1048576 -o upper.wasm upper.c */

#define M 37

/* A[i][j] = -999 for j > i, M x M doubles. */
void upper(double *A) {
  for (int i = 0; i < M; i++)
    for (int j = i + 1; j < M; j++)
      A[i * M + j] = -999;
}
