"""The CuPy peer: the library's own operation for each kernel where it has one.

``gemm`` and ``gemv`` are ``cupy.matmul`` (cuBLAS sgemm / sgemv), ``dot`` is ``cupy.dot``
(cuBLAS ddot), ``reduce`` is three reductions (sum, min, max), and ``saxpy`` and ``condmap``
are fused element-wise kernels. CuPy has no stencil operation. TF32 stays off for the
matrix products (``CUPY_TF32`` unset), so cuBLAS computes in full f32.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from benchmarks.peers.harness import Computation, Peer, Skip
from benchmarks.peers.workloads import SAXPY_A, Arrays
from benchmarks.programs import Params


class CuPy(Peer):
    """CuPy operations (cuBLAS and CuPy's own kernels)."""

    name = "cupy"

    def __init__(self) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise Skip(f"CuPy is not installed ({exc})") from None
        try:
            if cupy.cuda.runtime.getDeviceCount() == 0:
                raise Skip("CuPy sees no GPU")
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise Skip(f"CuPy sees no usable GPU ({exc})") from None
        self.cp = cupy
        self.saxpy = cupy.ElementwiseKernel("float32 a, float32 x", "float32 y", "y = a * x + y", "tw_saxpy")
        self.condmap = cupy.ElementwiseKernel(
            "float32 x", "float32 y", "y = x > 0.0f ? sqrtf(x) * 2.0f : x * x - 0.25f", "tw_condmap"
        )

    def versions(self) -> dict[str, str]:
        cp = self.cp
        versions = {"cupy": cp.__version__, "CUPY_TF32": os.environ.get("CUPY_TF32", "unset")}
        try:
            versions["cublas"] = str(cp.cuda.cublas.getVersion(cp.cuda.device.get_cublas_handle()))
        except Exception:
            pass
        return versions

    def unsupported(self, program: str) -> str | None:
        if program in ("stencil2d", "stencil3d"):
            return "CuPy has no stencil operation"
        return None

    def prepare(self, program: str, params: Params, data: Arrays) -> Computation:
        cp = self.cp
        n = params["n"]
        dev = {key: cp.asarray(value) for key, value in data.items()}
        results: dict[str, object] = {}
        steps: list[Callable[[], None]]
        if program == "saxpy":
            steps = [lambda: self.saxpy(SAXPY_A, dev["x"], dev["y"])] * params["reps"]
        elif program == "condmap":
            steps = [lambda: self.condmap(dev["x"], dev["y"])] * params["reps"]
        elif program == "gemv":
            a = dev["a"].reshape(n, n)
            steps = [lambda: results.update(y=cp.matmul(a, dev["x"]))]
        elif program == "gemm":
            a, b = dev["a"].reshape(n, n), dev["b"].reshape(n, n)
            steps = [lambda: results.update(c=cp.matmul(a, b))]
        elif program == "dot":
            steps = [lambda: results.update(dot=cp.dot(dev["x"], dev["y"]))]
        elif program == "reduce":
            x = dev["x"]
            steps = [
                lambda: results.update(
                    sum=x.sum(dtype=cp.int64), min=x.min(), max=x.max()
                )
            ]  # fmt: skip
        else:
            raise KeyError(program)

        def launch() -> None:
            for step in steps:
                step()

        def fetch() -> Arrays:
            got = {key: cp.asnumpy(value) for key, value in dev.items()}
            got.update({key: np.asarray(cp.asnumpy(value)).reshape(-1) for key, value in results.items()})
            for key in ("dot", "sum", "min", "max"):
                if key in got:
                    got[key] = got[key][0]
            return got

        return Computation(launch, fetch, len(steps) if program != "reduce" else 3)

    def synchronize(self) -> None:
        self.cp.cuda.Device().synchronize()

    def time(self, launch: Callable[[], None]) -> float:
        cp = self.cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        self.synchronize()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3
