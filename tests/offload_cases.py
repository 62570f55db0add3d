"""Calls of the example loop kernels with arrays placed at random in linear memory, run on
plain wasmtime and through the offload runtime, for the differential offload tests."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import wasmtime

from runtime.offload import OffloadModule
from tests.conftest import ROOT

BUILD = ROOT / "examples/loops/build"

# Each parameter: "n"/"m"/"k" a size, "f32"/"f64" a scalar, or (element, count) an array,
# the count a product of size names.
SPECS = {
    "blas1": {
        "saxpy": ["n", "f32", ("f32", "n"), ("f32", "n")],
        "daxpy": ["n", "f64", ("f64", "n"), ("f64", "n")],
        "sscal": ["n", "f32", ("f32", "n")],
        "idot": ["n", ("i32", "n"), ("i32", "n")],
    },
    "blas2": {"sgemv": ["m", "n", "f32", ("f32", "mn"), ("f32", "n"), "f32", ("f32", "m")]},
    "blas3": {"sgemm": ["m", "n", "k", ("f32", "mk"), ("f32", "kn"), ("f32", "mn")]},
    "maps": {
        "relu": ["n", ("f32", "n"), ("f32", "n")],
        "clamp": ["n", "f32", "f32", ("f32", "n"), ("f32", "n")],
        "abs_or_double": ["n", ("i32", "n")],
    },
    "reductions": {
        "isum": ["n", ("i32", "n")],
        "imin": ["n", ("i32", "n")],
        "imax": ["n", ("i32", "n")],
        "ixor": ["n", ("i32", "n")],
    },
    "stencil": {
        "jacobi1d": ["n", ("f32", "n"), ("f32", "n")],
        "jacobi2d": ["m", "n", ("f32", "mn"), ("f32", "mn")],
        "jacobi3d": ["m", "n", "k", ("f32", "mnk"), ("f32", "mnk")],
    },
    "reject": {
        "prefix_sum": ["n", ("i32", "n")],
        "gauss_seidel": ["m", "n", ("f32", "mn")],
        "histogram": ["n", ("i32", "n"), "m", ("i32", "m")],
    },
}
SIZE = {"i32": 4, "f32": 4, "f64": 8}


@dataclass
class Case:
    sizes: dict[str, int]
    scalars: list[float]
    gaps: list[int]  # bytes between arrays (can be negative: arrays overlap)
    seed: int


def instantiate(wasm: bytes, offload: OffloadModule | None = None):
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_func("env", "log_value", wasmtime.FuncType([wasmtime.ValType.i32()], []), lambda x: None)
    if offload is not None:
        offload.define(linker, store)
    return store, linker.instantiate(store, wasmtime.Module(engine, wasm))


def run_case(wasm: bytes, func: str, spec: list, case: Case, offload: OffloadModule | None = None):
    """Call ``func`` once; returns (result, memory bytes)."""
    import random

    store, inst = instantiate(wasm, offload)
    exports = inst.exports(store)
    memory = exports["memory"]
    base = exports["scratch_base"](store)
    rng = random.Random(case.seed)
    args = []
    scalars = iter(case.scalars)
    gaps = iter(case.gaps)
    at = base
    for param in spec:
        if isinstance(param, tuple):
            elem, dims = param
            count = 1
            for d in dims:
                count *= case.sizes[d]
            at = max(0, at + next(gaps))
            if elem == "i32":
                raw = b"".join(struct.pack("<i", rng.randrange(-50, 50)) for _ in range(count))
            else:
                fmt = "<f" if elem == "f32" else "<d"
                raw = b"".join(struct.pack(fmt, rng.uniform(-100, 100)) for _ in range(count))
            memory.write(store, raw, at)
            args.append(at)
            at += len(raw)
        elif param in ("f32", "f64"):
            args.append(next(scalars))
        else:
            args.append(case.sizes[param])
    result = exports[func](store, *args)
    return result, bytes(memory.read(store, 0, memory.data_len(store)))


def module_bytes(name: str, level: str) -> bytes:
    return (BUILD / f"{name}.{level}.wasm").read_bytes()
