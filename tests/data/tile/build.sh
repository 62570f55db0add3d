#!/bin/sh
# Rebuild the tiling tests' module (the .wasm is committed: the tests need no clang).
set -e
cd "$(dirname "$0")"
clang-16 --target=wasm32 -O2 -fno-vectorize -fno-slp-vectorize -nostdlib -Wl,--no-entry -Wl,--export-memory -o nests.O2.wasm nests.c
