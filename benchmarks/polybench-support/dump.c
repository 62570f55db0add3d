/* Full-precision array dumps for PolyBench/C, with its sources unmodified.
 *
 * The programs are compiled with -Dfprintf=tw_fprintf (this file without it), so every
 * fprintf of a benchmark and of polybench.c comes here. A floating-point element, printed
 * by PolyBench with "%0.2lf " or "%0.2f " (two decimals), is written as the 16 hex digits
 * of its double's bits instead (a float is widened exactly), so outputs compare bit for
 * bit. Everything meant for stderr (the dump) goes to stdout, after the kernel's time:
 * stderr stays free for the runtime's own report. */
#undef fprintf /* this file is compiled with the others: it calls the real one */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int tw_fprintf(FILE *stream, const char *format, ...) {
  va_list args;
  int written;
  if (stream == stderr)
    stream = stdout;
  va_start(args, format);
  if (strcmp(format, "%0.2lf ") == 0 || strcmp(format, "%0.2f ") == 0) {
    double value = va_arg(args, double);
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    written = fprintf(stream, "%016llx ", (unsigned long long)bits);
  } else {
    written = vfprintf(stream, format, args);
  }
  va_end(args);
  return written;
}
