/* Vectorised inner loops whose scalar remainder runs zero times at some sizes
   (tests/compiler/test_simd_remainder.py): clang's vector loop covers a row's interior of
   w - 2 elements 16 bytes at a time, and the remainder loop after it is skipped where w - 2
   is a multiple of the vector width (16 bytes, 4 floats), entered otherwise, and run alone
   where the row is too short for the vector loop.
   Build: clang-16 --target=wasm32-wasi -O2 -msimd128 -nostdlib -Wl,--no-entry
          -Wl,--export-all -Wl,--initial-memory=1048576 -o remainder.wasm remainder.c */

/* Deterministic bytes. */
void fill8(int n, unsigned char *a, int seed) {
  for (int i = 0; i < n; i++)
    a[i] = (unsigned char)((i * seed) >> 3);
}

/* Deterministic floats. */
void fillf(int n, float *a, int seed) {
  for (int i = 0; i < n; i++)
    a[i] = (float)((i * seed) % 97) / 5.0f;
}

/* A 1-D box blur of each of h rows of w bytes (interior points): 16 per vector step. */
void rows8(int h, int w, const unsigned char *restrict in, unsigned char *restrict out) {
  for (int y = 0; y < h; y++)
    for (int x = 1; x < w - 1; x++)
      out[y * w + x] = (unsigned char)((in[y * w + x - 1] + in[y * w + x] + in[y * w + x + 1]) / 3);
}

/* The same over floats: 4 per vector step. */
void rowsf(int h, int w, const float *restrict in, float *restrict out) {
  for (int y = 0; y < h; y++)
    for (int x = 1; x < w - 1; x++)
      out[y * w + x] = 0.5f * in[y * w + x] - 0.25f * (in[y * w + x - 1] + in[y * w + x + 1]);
}
