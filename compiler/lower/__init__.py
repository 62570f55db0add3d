"""Lowering: the dialect to LLVM IR with Wasm's semantics, split by op family."""
