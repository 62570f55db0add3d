"""The suite's data, output lines and reference results in NumPy, for the peers.

:func:`inputs` builds the arrays that ``benchmarks/suite/suite.h`` and each program's
``main`` build (the same index hashes, bit for bit), so a peer computes on the program's own
data. :func:`output_line` prints a peer's result the way the program prints its own: where the
peer computes exactly what the Wasm program computes, the two lines are identical. :func:`reference`
is the plain NumPy result that a peer's kernels are checked against at a small size.
"""

from __future__ import annotations

import numpy as np

from benchmarks.programs import Params

Arrays = dict[str, np.ndarray]

SAXPY_A = np.float32(1.5)
_KNUTH = np.uint32(2654435761)


def _hash(count: int, seed: int) -> np.ndarray:
    """``h = i * 2654435761 + seed; h ^= h >> 15`` over ``i < count``, in uint32 (wrapping)."""
    h = np.arange(count, dtype=np.uint32)
    h *= _KNUTH
    h += np.uint32(seed)
    h ^= h >> np.uint32(15)
    return h


def hash_f32(count: int, seed: int) -> np.ndarray:
    """suite.h's ``hash_f32``: values in [-0.5, 0.5)."""
    values = (_hash(count, seed) & np.uint32(0xFFFF)).astype(np.float32)
    values *= np.float32(1.0 / 65536.0)
    values -= np.float32(0.5)
    return values


def hash_small(count: int, seed: int) -> np.ndarray:
    """suite.h's ``hash_small`` as f64: integers in [-8, 7]."""
    return ((_hash(count, seed) & np.uint32(15)).astype(np.int32) - 8).astype(np.float64)


def inputs(program: str, p: Params) -> Arrays:
    """The arrays the program's ``main`` passes to its kernel function."""
    n = p["n"]
    if program == "saxpy":
        return {"x": hash_f32(n, 1), "y": hash_f32(n, 2)}
    if program == "dot":
        return {"x": hash_small(n, 3), "y": hash_small(n, 4)}
    if program == "reduce":
        return {"x": (_hash(n, 5) % np.uint32(2000001)).astype(np.int32) - np.int32(1000000)}
    if program == "condmap":
        return {"x": hash_f32(n, 6), "y": np.zeros(n, np.float32)}
    if program == "gemv":
        return {"a": hash_f32(n * n, 7), "x": hash_f32(n, 8), "y": np.zeros(n, np.float32)}
    if program == "gemm":
        return {"a": hash_f32(n * n, 9), "b": hash_f32(n * n, 10), "c": np.zeros(n * n, np.float32)}
    if program == "stencil2d":
        a = hash_f32(n * n, 11)
        a[:n] = 1.0
        return {"a": a, "b": a.copy()}
    if program == "stencil3d":
        a = hash_f32(n * n * n, 12)
        a[: n * n] = 1.0
        return {"a": a, "b": a.copy()}
    raise KeyError(program)


def checksum(values: np.ndarray) -> int:
    """suite.h's ``checksum_f32``: sum of bits * (index + 1), modulo 2**64."""
    bits = values.view(np.uint32).astype(np.uint64)
    bits *= np.arange(1, len(values) + 1, dtype=np.uint64)
    return int(bits.sum(dtype=np.uint64))


def result_array(program: str, p: Params, arrays: Arrays) -> np.ndarray | None:
    """The array a program checksums after its kernel ran (stencils: by step parity)."""
    if program in ("saxpy", "condmap", "gemv"):
        return arrays["y"]
    if program == "gemm":
        return arrays["c"]
    if program in ("stencil2d", "stencil3d"):
        return arrays["a"] if p["steps"] % 2 == 0 else arrays["b"]
    return None


def output_line(program: str, p: Params, arrays: Arrays) -> str:
    """What the Wasm program prints, given the arrays (and ``dot``/``sum``/``min``/``max``
    scalars as 0-d arrays) after its kernel function ran."""
    n = p["n"]
    out = result_array(program, p, arrays)
    if program in ("saxpy", "condmap"):
        return (
            f"{program} n={n} reps={p['reps']} checksum={checksum(out):016x} "
            f"y[n/2]={float(out[n // 2]):.9g}\n"
        )
    if program == "gemv":
        return f"gemv n={n} checksum={checksum(out):016x} y[n/2]={float(out[n // 2]):.9g}\n"
    if program == "gemm":
        return f"gemm n={n} checksum={checksum(out):016x} c[n*n/2]={float(out[n * n // 2]):.9g}\n"
    if program in ("stencil2d", "stencil3d"):
        return f"{program} n={n} steps={p['steps']} checksum={checksum(out):016x}\n"
    if program == "dot":
        return f"dot n={n} dot={float(arrays['dot']):.1f}\n"
    if program == "reduce":
        return f"reduce n={n} sum={int(arrays['sum'])} min={int(arrays['min'])} max={int(arrays['max'])}\n"
    raise KeyError(program)


def reference(program: str, p: Params) -> Arrays:
    """The kernel function's results computed with NumPy (f32 stays f32)."""
    data = inputs(program, p)
    n = p["n"]
    if program == "saxpy":
        for _ in range(p["reps"]):
            data["y"] = SAXPY_A * data["x"] + data["y"]
    elif program == "condmap":
        x = data["x"]
        with np.errstate(invalid="ignore"):
            data["y"] = np.where(x > 0, np.sqrt(x) * np.float32(2), x * x - np.float32(0.25))
    elif program == "gemv":
        data["y"] = data["a"].reshape(n, n) @ data["x"]
    elif program == "gemm":
        data["c"] = (data["a"].reshape(n, n) @ data["b"].reshape(n, n)).ravel()
    elif program == "stencil2d":
        a, b = data["a"].reshape(n, n), data["b"].reshape(n, n)
        for _ in range(p["steps"]):
            b[1:-1, 1:-1] = np.float32(0.2) * (
                a[1:-1, 1:-1] + a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:]
            )
            a, b = b, a
    elif program == "stencil3d":
        a, b = data["a"].reshape(n, n, n), data["b"].reshape(n, n, n)
        c = np.s_[1:-1]
        for _ in range(p["steps"]):
            b[c, c, c] = np.float32(1.0 / 7.0) * (
                a[c, c, c]
                + a[:-2, c, c]
                + a[2:, c, c]
                + a[c, :-2, c]
                + a[c, 2:, c]
                + a[c, c, :-2]
                + a[c, c, 2:]
            )
            a, b = b, a
    elif program == "dot":
        data["dot"] = np.array(np.dot(data["x"], data["y"]))
    elif program == "reduce":
        x = data["x"]
        data.update(sum=np.array(x.sum(dtype=np.int64)), min=np.array(x.min()), max=np.array(x.max()))
    return data


def max_error(program: str, p: Params, got: Arrays) -> float:
    """The largest difference of a peer's results from :func:`reference`, relative to the
    reference's largest magnitude (exact results give 0)."""
    want = reference(program, p)
    if program == "dot":
        keys = ["dot"]
    elif program == "reduce":
        keys = ["sum", "min", "max"]
    else:
        keys = ["result"]
        want = {"result": result_array(program, p, want)}
        got = {"result": result_array(program, p, got)}
    worst = 0.0
    for key in keys:
        w = np.asarray(want[key], dtype=np.float64)
        g = np.asarray(got[key], dtype=np.float64)
        scale = max(1.0, float(np.max(np.abs(w))))
        worst = max(worst, float(np.max(np.abs(g - w))) / scale)
    return worst
