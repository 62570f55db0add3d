"""Calls of the example loop kernels with arrays placed at random in linear memory, run on
plain wasmtime and through the offload runtime, for the differential offload tests."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import wasmtime

from tensorwasm.runtime.offload import OffloadModule
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
                raw = _float_bytes(rng, count * SIZE[elem], SIZE[elem])
            memory.write(store, raw, at)
            args.append(at)
            at += len(raw)
        elif param in ("f32", "f64"):
            args.append(next(scalars))
        else:
            args.append(case.sizes[param])
    result = exports[func](store, *args)
    return result, bytes(memory.read(store, 0, memory.data_len(store)))


def _float_bytes(rng, nbytes: int, size: int) -> bytes:
    """Floats whose every byte is below 0x7f: any 4 or 8 bytes of them, aligned or not (the
    tests overlap arrays), read as a float are finite and positive. So no NaN arises, whose
    payload Wasm leaves to the implementation and would make memories differ legitimately."""
    out = bytearray(rng.randrange(0, 0x7F) for _ in range(nbytes))
    for i in range(size - 1, nbytes, size):
        out[i] = rng.randrange(0x3C, 0x43) if size == 4 else rng.randrange(0x3F, 0x41)
    return bytes(out)


def module_bytes(name: str, level: str) -> bytes:
    return (BUILD / f"{name}.{level}.wasm").read_bytes()
