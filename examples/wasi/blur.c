/* Image filter: a 3x3 box blur of a grey-scale image, repeated a few times.
 * Usage: blur [width] [height] [passes]   (default 256 256 4); prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

static void blur(int w, int h, const unsigned char *in, unsigned char *out) {
  for (int y = 1; y < h - 1; y++)
    for (int x = 1; x < w - 1; x++) {
      int s = 0;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) s += in[(y + dy) * w + (x + dx)];
      out[y * w + x] = (unsigned char)(s / 9);
    }
}

int main(int argc, char **argv) {
  int w = argc > 1 ? atoi(argv[1]) : 256;
  int h = argc > 2 ? atoi(argv[2]) : 256;
  int passes = argc > 3 ? atoi(argv[3]) : 4;
  if (w < 3 || h < 3 || w > 8192 || h > 8192 || passes < 0) {
    fprintf(stderr, "blur: need 3 <= width, height <= 8192 and passes >= 0\n");
    return 1;
  }
  unsigned char *a = malloc((size_t)w * h), *b = malloc((size_t)w * h);
  if (!a || !b) {
    fprintf(stderr, "blur: out of memory\n");
    return 1;
  }
  unsigned state = 7u;
  for (int i = 0; i < w * h; i++) {
    state = state * 1103515245u + 12345u;
    a[i] = b[i] = (unsigned char)(state >> 16);
  }
  for (int p = 0; p < passes; p++) {
    blur(w, h, a, b);
    unsigned char *t = a;
    a = b;
    b = t;
  }
  unsigned long long sum = 0;
  for (int i = 0; i < w * h; i++) sum = sum * 31 + a[i];
  printf("blur %dx%d passes=%d checksum=%llu\n", w, h, passes, sum);
  return 0;
}
