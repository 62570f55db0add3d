"""The benchmark suite: one row per program of ``benchmarks/suite``, with its sizes and work.

Each program is a WASI command built from ``benchmarks/suite/<name>.c`` by
``benchmarks/suite/build.sh``; its kernel loops live in the function ``kernel_<name>``, which
is how the runner tells them from the program's set-up and checksum loops. A program's
parameters are its command-line arguments, in order (``n``, then ``reps`` or ``steps``).

The work model says what one run of the kernel function must do at least: ``bytes`` is the
DRAM traffic of a perfect implementation (each array element read or written once per pass),
``flops`` the floating-point operations. Bandwidth-bound programs are judged against the
device's measured copy bandwidth with ``bytes``; compute-bound ones are loop nests, judged
against the peers' kernel times and, end to end, against plain wasmtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "suite"
BUILD = SUITE / "build"

BANDWIDTH = "bandwidth"
COMPUTE = "compute"
SIZE_SETS = ("small", "large")

Params = dict[str, int]


@dataclass(frozen=True)
class Program:
    """One benchmark program: its parameters, sizes and work model."""

    name: str
    params: tuple[str, ...]
    category: str  # BANDWIDTH or COMPUTE
    summary: str
    sizes: dict[str, tuple[tuple[int, ...], ...]]
    bytes: Callable[[Params], int]
    flops: Callable[[Params], int]
    # Float reductions may be reordered (tensorwasm run --relaxed-float): the program's
    # data makes every order give the same bits.
    relaxed_float: bool = False
    # The -msimd128 build (``<name>.simd.wasm``, clang's vectoriser's SIMD128 loops).
    simd: bool = False

    @property
    def wasm(self) -> Path:
        return BUILD / f"{self.name}{'.simd' if self.simd else ''}.wasm"

    @property
    def kernel_function(self) -> str:
        """The Wasm function (name section) that holds the program's kernel loops."""
        return f"kernel_{self.name}"

    def bind(self, values: tuple[int, ...]) -> Params:
        """Name a size's values: ``(4096, 2)`` -> ``{"n": 4096, "reps": 2}``."""
        return dict(zip(self.params, values, strict=True))

    def argv(self, params: Params) -> list[str]:
        return [str(params[p]) for p in self.params]

    def label(self, params: Params) -> str:
        """A short human label of one size, e.g. ``n=4096 reps=2``."""
        return " ".join(f"{p}={params[p]}" for p in self.params)


def _passes(p: Params) -> int:
    return p.get("reps", 1)


PROGRAMS: dict[str, Program] = {
    prog.name: prog
    for prog in (
        Program(
            "saxpy", ("n", "reps"), BANDWIDTH, "y = a*x + y (f32), repeated",
            {"small": ((4096, 2),), "large": ((1 << 22, 10), (1 << 24, 10), (1 << 26, 10))},
            bytes=lambda p: 12 * p["n"] * _passes(p), flops=lambda p: 2 * p["n"] * _passes(p),
        ),
        Program(
            "dot", ("n",), BANDWIDTH, "f64 dot product (a float reduction of integer values)",
            {"small": ((4096,),), "large": ((1 << 22,), (1 << 24,), (1 << 26,))},
            bytes=lambda p: 16 * p["n"], flops=lambda p: 2 * p["n"], relaxed_float=True,
        ),
        Program(
            "reduce", ("n",), BANDWIDTH, "sum, min and max of an i32 vector",
            {"small": ((4096,),), "large": ((1 << 22,), (1 << 24,), (1 << 26,))},
            bytes=lambda p: 4 * p["n"], flops=lambda p: 0,
        ),
        Program(
            "condmap", ("n", "reps"), BANDWIDTH, "f32 map with a per-element condition, repeated",
            {"small": ((4096, 2),), "large": ((1 << 22, 10), (1 << 24, 10), (1 << 26, 10))},
            bytes=lambda p: 8 * p["n"] * _passes(p), flops=lambda p: 2 * p["n"] * _passes(p),
        ),
        Program(
            "gemv", ("n",), BANDWIDTH, "y = A x, n x n f32, one output per row",
            {"small": ((96,),), "large": ((2048,), (4096,), (8192,))},
            bytes=lambda p: 4 * (p["n"] * p["n"] + 2 * p["n"]), flops=lambda p: 2 * p["n"] ** 2,
        ),
        Program(
            "gemm", ("n",), COMPUTE, "C = A B, n x n f32, one output per (i, j)",
            {"small": ((48,),), "large": ((512,), (1024,), (2048,))},
            bytes=lambda p: 12 * p["n"] ** 2, flops=lambda p: 2 * p["n"] ** 3,
        ),
        Program(
            "stencil2d", ("n", "steps"), COMPUTE, "2-D 5-point Jacobi, n x n f32, over time steps",
            {"small": ((48, 3),), "large": ((1024, 100), (2048, 100), (4096, 100))},
            bytes=lambda p: 8 * (p["n"] - 2) ** 2 * p["steps"],
            flops=lambda p: 5 * (p["n"] - 2) ** 2 * p["steps"],
        ),
        Program(
            "stencil3d", ("n", "steps"), COMPUTE, "3-D 7-point Jacobi, n^3 f32, over time steps",
            {"small": ((20, 3),), "large": ((128, 50), (256, 50), (384, 30))},
            bytes=lambda p: 8 * (p["n"] - 2) ** 3 * p["steps"],
            flops=lambda p: 7 * (p["n"] - 2) ** 3 * p["steps"],
        ),
    )
}  # fmt: skip


def select(names: str | None) -> list[Program]:
    """The programs named in a comma-separated list (all of them for None or "all")."""
    if not names or names == "all":
        return list(PROGRAMS.values())
    chosen = []
    for name in names.split(","):
        if name.strip() not in PROGRAMS:
            raise ValueError(f"no benchmark program {name.strip()!r} (have: {', '.join(PROGRAMS)})")
        chosen.append(PROGRAMS[name.strip()])
    return chosen
