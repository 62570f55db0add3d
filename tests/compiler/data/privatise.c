/* doitgen-shaped nests whose temporary array `sum` is written before it is read in
   every (r, q) iteration (tests/compiler/test_privatise.py). The arrays come in as
   pointers, as PolyBench's kernels take them.
   Built with: clang-16 --target=wasm32-wasi -O2 -nostdlib -Wl,--no-entry -Wl,--export-dynamic
   -o privatise.wasm privatise.c */
#define NR 8
#define NQ 12
#define NP 32

double A[NR][NQ][NP], C4[NP][NP], sum[NP];

__attribute__((export_name("init"))) void init(void) {
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++)
      for (int p = 0; p < NP; p++) A[r][q][p] = (double)((r * q + p) % NP) / NP;
  for (int s = 0; s < NP; s++)
    for (int p = 0; p < NP; p++) C4[s][p] = (double)(s * p % NP) / NP;
  for (int p = 0; p < NP; p++) sum[p] = -1.0;
}

__attribute__((export_name("A_"))) double *a_(void) { return &A[0][0][0]; }
__attribute__((export_name("C4_"))) double *c4_(void) { return &C4[0][0]; }
__attribute__((export_name("sum_"))) double *sum_(void) { return sum; }

/* PolyBench's doitgen: every sum[p] read in an (r, q) iteration was written earlier in
   the same iteration, so `sum` is privatisable. */
__attribute__((export_name("doitgen")))
void doitgen(double (*a)[NQ][NP], double (*c4)[NP], double *s_) {
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++) {
      for (int p = 0; p < NP; p++) {
        s_[p] = 0.0;
        for (int s = 0; s < NP; s++) s_[p] += a[r][q][s] * c4[s][p];
      }
      for (int p = 0; p < NP; p++) a[r][q][p] = s_[p];
    }
}

/* The same, but the first loop leaves s_[NP - 1] unwritten, which the copy reads: an
   upward-exposed read of what the previous iteration left there (or what was there). */
__attribute__((export_name("exposed")))
void exposed(double (*a)[NQ][NP], double (*c4)[NP], double *s_) {
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++) {
      for (int p = 0; p < NP - 1; p++) {
        s_[p] = 0.0;
        for (int s = 0; s < NP; s++) s_[p] += a[r][q][s] * c4[s][p];
      }
      for (int p = 0; p < NP; p++) a[r][q][p] = s_[p];
    }
}

/* The same, but a row is computed only where its first element is positive: elsewhere
   the copy reads what an earlier iteration left in s_ (the writes do not run in every
   iteration). */
__attribute__((export_name("guarded")))
void guarded(double (*a)[NQ][NP], double (*c4)[NP], double *s_) {
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++) {
      if (a[r][q][0] > 0.0)
        for (int p = 0; p < NP; p++) {
          s_[p] = 0.0;
          for (int s = 0; s < NP; s++) s_[p] += a[r][q][s] * c4[s][p];
        }
      for (int p = 0; p < NP; p++) a[r][q][p] = s_[p];
    }
}
