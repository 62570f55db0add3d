/* Row sweeps as clang -O2 -msimd128 vectorises them (tests/compiler/test_simd_grid.py): each
   row's loop becomes a vector loop (16 bytes a step) and its scalar remainder, two loops in
   the row body, distributed as two phases of a 2-D grid (a block per row, its threads over
   the row's vector steps, then over its remainder). The row stride m is a size passed in.
   Built with: clang-16 --target=wasm32-wasi -O2 -msimd128 -nostdlib -Wl,--no-entry
   -Wl,--export-dynamic -o simdgrid.wasm simdgrid.c */
#define CELLS 2400

float A[CELLS], B[CELLS];
unsigned char P[CELLS], Q[CELLS];

__attribute__((export_name("addr"))) int addr(int which) {
  return which == 0 ? (int)A : which == 1 ? (int)B : which == 2 ? (int)P : (int)Q;
}

__attribute__((export_name("init"))) void init(void) {
  for (int i = 0; i < CELLS; i++) {
    A[i] = (float)((i * 37 + 11) % 101) / 7.0f;
    B[i] = -1.0f;
    P[i] = (unsigned char)(i * 73 + 5);
    Q[i] = (unsigned char)(i * 3 + 1);
  }
}

/* The 5-point stencil of examples/wasi/stencil.c on an n x m grid (through pointers, as the
   example's malloc'd grids: the guards keep a row's threads apart). */
__attribute__((export_name("sweep"))) void sweep(int n, int m, float *restrict out,
                                                 const float *restrict in) {
  for (int i = 1; i < n - 1; i++)
    for (int j = 1; j < m - 1; j++)
      out[i * m + j] = 0.2f * (in[i * m + j] + in[(i - 1) * m + j] + in[(i + 1) * m + j] +
                               in[i * m + j - 1] + in[i * m + j + 1]);
}

/* examples/wasi/blur.c: a 3x3 box blur of bytes, divided by the constant 9. */
__attribute__((export_name("blur"))) void blur(int n, int m, unsigned char *restrict out,
                                               const unsigned char *restrict in) {
  for (int y = 1; y < n - 1; y++)
    for (int x = 1; x < m - 1; x++) {
      unsigned s = 0;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) s += in[(y + dy) * m + (x + dx)];
      out[y * m + x] = (unsigned char)(s / 9);
    }
}

/* The same divided by a value passed in: a division that may trap (by zero) keeps one
   thread per row (a barrier waits for every thread of the block). */
__attribute__((export_name("blur_by"))) void blur_by(int n, int m, unsigned d,
                                                     unsigned char *restrict out,
                                                     const unsigned char *restrict in) {
  for (int y = 1; y < n - 1; y++)
    for (int x = 1; x < m - 1; x++) {
      unsigned s = 0;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) s += in[(y + dy) * m + (x + dx)];
      out[y * m + x] = (unsigned char)(s / d);
    }
}
