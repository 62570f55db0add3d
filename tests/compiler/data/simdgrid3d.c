/* 3-D sweeps as clang -O2 -msimd128 vectorises them (tests/compiler/test_simd_grid3d.py):
   the innermost loop over z becomes a vector loop (16 bytes a step) and its scalar
   remainder, two loops in the body of the (x, y) nest, distributed as two phases of a 3-D
   grid (a block per (x, y) cell, its threads over the cell's vector steps, then over its
   remainder). The strides are sizes passed in.
   Built with: clang-16 --target=wasm32-wasi -O2 -msimd128 -nostdlib -Wl,--no-entry
   -Wl,--export-dynamic -o simdgrid3d.wasm simdgrid3d.c */
#define CELLS 6000

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

/* The 7-point stencil of benchmarks/suite/stencil3d.c on an n x m x l grid. */
__attribute__((export_name("sweep"))) void sweep(int n, int m, int l, float *restrict out,
                                                 const float *restrict in) {
  int sx = m * l, sy = l;
  for (int x = 1; x < n - 1; x++)
    for (int y = 1; y < m - 1; y++)
      for (int z = 1; z < l - 1; z++) {
        int c = x * sx + y * sy + z;
        out[c] = (1.0f / 7.0f) * (in[c] + in[c - sx] + in[c + sx] + in[c - sy] + in[c + sy] +
                                  in[c - 1] + in[c + 1]);
      }
}

/* Bytes: the difference of a cell and its neighbour below in z, 16 a vector step. */
__attribute__((export_name("diff"))) void diff(int n, int m, int l, unsigned char *restrict out,
                                               const unsigned char *restrict in) {
  for (int x = 0; x < n; x++)
    for (int y = 0; y < m; y++)
      for (int z = 1; z < l; z++) {
        int c = (x * m + y) * l + z;
        out[c] = (unsigned char)(in[c] - in[c - 1]) ^ 0x5a;
      }
}

/* A load in the x body before the (y, z) loops (the plane's factor): every thread of a
   3-D grid's block would rerun it at each call, after the cell's earlier phase, so the
   nest keeps its 2-D grid (each thread a whole z row). */
__attribute__((export_name("scaled"))) void scaled(int n, int m, int l, float *restrict out,
                                                   const float *restrict in,
                                                   const float *restrict factor) {
  for (int x = 0; x < n; x++) {
    float f = factor[x];
    for (int y = 0; y < m; y++)
      for (int z = 0; z < l; z++) out[(x * m + y) * l + z] = in[(x * m + y) * l + z] * f;
  }
}
