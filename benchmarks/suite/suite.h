/* Shared by the benchmark programs: argument parsing, deterministic data and an
 * exact checksum.
 *
 * Data is a hash of the element index, so every value is known without running
 * earlier code (the init loops are parallel) and the peers in benchmarks/peers
 * build the same arrays.  The checksum is a position-weighted sum of the bit
 * patterns of the result: an integer reduction, exact in any summation order,
 * that changes when any bit of any element changes. */
#ifndef SUITE_H
#define SUITE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argv[index] as an int in [lo, hi], or the default when absent; exits on bad input. */
static inline int arg_int(int argc, char **argv, int index, const char *name, int fallback,
                   int lo, int hi) {
  int value = argc > index ? atoi(argv[index]) : fallback;
  if (value < lo || value > hi) {
    fprintf(stderr, "%s: %s must be in %d..%d\n", argv[0], name, lo, hi);
    exit(2);
  }
  return value;
}

static inline void *alloc(size_t count, size_t size) {
  void *p = calloc(count, size);
  if (!p) {
    fprintf(stderr, "out of memory (%zu x %zu bytes)\n", count, size);
    exit(3);
  }
  return p;
}

/* A value in [-0.5, 0.5) from the index i and a seed (Knuth's multiplicative hash). */
static inline float hash_f32(uint32_t i, uint32_t seed) {
  uint32_t h = i * 2654435761u + seed;
  h ^= h >> 15;
  return (float)(h & 0xffffu) * (1.0f / 65536.0f) - 0.5f;
}

/* An integer in [-8, 7] from the index i and a seed. */
static inline int hash_small(uint32_t i, uint32_t seed) {
  uint32_t h = i * 2654435761u + seed;
  h ^= h >> 15;
  return (int)(h & 15u) - 8;
}

static inline void fill_f32(float *a, int n, uint32_t seed) {
  for (int i = 0; i < n; i++) a[i] = hash_f32((uint32_t)i, seed);
}

static inline uint64_t checksum_f32(const float *a, int n) {
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &a[i], sizeof bits);
    sum += (uint64_t)bits * (uint64_t)(i + 1);
  }
  return sum;
}

#endif
