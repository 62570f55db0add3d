#!/usr/bin/env bash
# Build the benchmark programs: benchmarks/suite/<name>.c -> benchmarks/suite/build/<name>.wasm
# (WASI commands against wasi-libc, -O2), the same way scripts/build-examples builds
# examples/wasi; and the SIMD build of each, -O2 -msimd128 (clang's vectoriser then emits
# SIMD128), as benchmarks/suite/build/<name>.simd.wasm.
#
# Needs (Debian 12): clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32
#   apt-get install -y clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32
#
# Output is deterministic: no -g, DWARF from wasi-libc is stripped at link time
# (--strip-debug), paths are relative. The "name" section is kept: the benchmark runner
# finds each program's kernel loops by their function name (kernel_<name>). Compile and
# link are separate steps and the link step gets no -O flag, so clang never runs a
# wasm-opt it might find on PATH.
#
# Env overrides: CLANG (default clang-16), WASI_SYSROOT (default /usr, the Debian
# wasi-libc layout: /usr/include/wasm32-wasi, /usr/lib/wasm32-wasi).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

CLANG="${CLANG:-clang-16}"
WASI_SYSROOT="${WASI_SYSROOT:-/usr}"
SUITE=benchmarks/suite

CFLAGS=(--target=wasm32-wasi --sysroot="$WASI_SYSROOT" -std=c11 -Wall -Wextra
  -ffile-prefix-map="$ROOT"=. -O2)
# Linear memory may grow to 4 GiB: the large problem sizes need more than the default 2 GiB.
LDFLAGS=(--target=wasm32-wasi --sysroot="$WASI_SYSROOT" -Wl,--strip-debug
  -Wl,--max-memory=4294967296)

if ! command -v "$CLANG" >/dev/null; then
  echo "build.sh: $CLANG not found (apt-get install clang-16 lld-16)" >&2
  exit 1
fi
if [ ! -d "$WASI_SYSROOT/lib/wasm32-wasi" ]; then
  echo "build.sh: no wasi-libc under $WASI_SYSROOT/lib/wasm32-wasi (apt-get install wasi-libc)" >&2
  exit 1
fi
# wasi-libc's printf needs the wasm32 compiler-rt builtins (long double).
RT="$("$CLANG" --target=wasm32-wasi -print-libgcc-file-name)"
if [ ! -f "$RT" ]; then
  echo "build.sh: missing $RT (apt-get install libclang-rt-16-dev-wasm32)" >&2
  exit 1
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$SUITE/build"

for src in "$SUITE"/*.c; do
  name="$(basename "$src" .c)"
  for variant in scalar simd; do
    extra=() out="$SUITE/build/$name.wasm"
    if [ "$variant" = simd ]; then
      extra=(-msimd128) out="$SUITE/build/$name.simd.wasm"
    fi
    "$CLANG" "${CFLAGS[@]}" "${extra[@]}" -c "$src" -o "$TMP/$name.o"
    "$CLANG" "${LDFLAGS[@]}" "$TMP/$name.o" -o "$out"
    chmod 644 "$out"
    echo "built $out"
  done
done
