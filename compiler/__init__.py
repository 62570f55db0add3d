"""WebAssembly to NVIDIA PTX (and host code): frontend, analyses, lowering, targets."""

COMPILER_VERSION = "0.1.0"  # part of every cache key
