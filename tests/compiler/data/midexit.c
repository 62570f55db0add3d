/* Loops clang -O2 unrolls by two for an odd constant count, with the exit test between the
   two halves of the body: `loop { body(j); if (j == last) break; body(j + 1); j += 2; }`
   (PolyBench's fdtd-2d, NY = 1200: its `ex` sweep). For tests/compiler/test_mid_exit.py.
   NX rows of NY doubles (63 columns past the first: an odd count); NY_EVEN's rows give an
   even count, which clang unrolls with the test at the bottom. The sizes are constants, as
   PolyBench's are.
   Build: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-all
          -Wl,--initial-memory=1048576 -o midexit.wasm midexit.c */

#define NX 40
#define NY 64
#define NY_EVEN 65
#define TMAX 3

/* Deterministic data in an array of n doubles. */
void fill(int n, double *A, int seed) {
  for (int i = 0; i < n; i++)
    A[i] = (double)((i * seed) % 101) / 7.0;
}

/* fdtd-2d's ex sweep, TMAX times (clang repeats the nest): the inner loop's test sits
   halfway through its body. */
void sweep(double ex[][NY], double hz[][NY]) {
  for (int t = 0; t < TMAX; t++)
    for (int i = 0; i < NX; i++)
      for (int j = 1; j < NY; j++)
        ex[i][j] = ex[i][j] - 0.5 * (hz[i][j] - hz[i][j - 1]);
}

/* One row: the loop with the test halfway through is the launched loop itself. */
void sweep_row(double *ex, double *hz) {
  for (int j = 1; j < NY; j++)
    ex[j] = ex[j] - 0.5 * (hz[j] - hz[j - 1]);
}

/* The same sweep with an even count: unrolled by two, tested at the bottom. */
void sweep_even(double ex[][NY_EVEN], double hz[][NY_EVEN]) {
  for (int t = 0; t < TMAX; t++)
    for (int i = 0; i < NX; i++)
      for (int j = 1; j < NY_EVEN; j++)
        ex[i][j] = ex[i][j] - 0.5 * (hz[i][j] - hz[i][j - 1]);
}
