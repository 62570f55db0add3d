"""The numba-cuda peer: the kernels of :mod:`benchmarks.peers.numba_kernels`, launched on the
default stream and timed with numba's CUDA events."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib import metadata

import numpy as np

from benchmarks.peers.harness import Computation, Peer, Skip, ceil_div
from benchmarks.peers.workloads import SAXPY_A, Arrays
from benchmarks.programs import Params

F32 = np.float32


class NumbaCuda(Peer):
    """numba.cuda kernels."""

    name = "numba-cuda"

    def __init__(self) -> None:
        try:
            from benchmarks.peers import numba_kernels
        except ImportError as exc:
            raise Skip(f"numba-cuda is not installed ({exc})") from None
        self.cuda = numba_kernels.cuda
        if not self.cuda.is_available():
            raise Skip("numba-cuda sees no usable GPU")
        warnings.filterwarnings("ignore", module="numba")  # grid-size performance hints
        self.kernels = numba_kernels.KERNELS
        self.block = numba_kernels.BLOCK  # threads per block; the reductions' shared arrays fit it
        device = self.cuda.get_current_device()
        # Reductions: a few blocks per multiprocessor (numba's simulator does not say how many).
        self.reduction_blocks = 8 * getattr(device, "MULTIPROCESSOR_COUNT", 16)

    def versions(self) -> dict[str, str]:
        import numba

        try:
            numba_cuda = metadata.version("numba-cuda")
        except metadata.PackageNotFoundError:
            numba_cuda = "unknown"
        return {"numba": numba.__version__, "numba-cuda": numba_cuda}

    def prepare(self, program: str, params: Params, data: Arrays) -> Computation:
        cuda, k = self.cuda, self.kernels
        n = params["n"]
        dev = {key: cuda.to_device(value) for key, value in data.items()}
        one_d = ceil_div(n, self.block)
        steps: list[Callable[[], None]]
        if program == "saxpy":
            saxpy = k["saxpy"][one_d, self.block]
            steps = [lambda: saxpy(n, SAXPY_A, dev["x"], dev["y"])] * params["reps"]
        elif program == "condmap":
            condmap = k["condmap"][one_d, self.block]
            steps = [lambda: condmap(n, dev["x"], dev["y"], F32(2), F32(0.25))] * params["reps"]
        elif program == "gemv":
            gemv = k["gemv"][one_d, self.block]
            steps = [lambda: gemv(n, dev["a"], dev["x"], dev["y"], F32(0))]
        elif program == "gemm":
            gemm = k["gemm"][(ceil_div(n, 16), ceil_div(n, 16)), (16, 16)]
            steps = [lambda: gemm(n, dev["a"], dev["b"], dev["c"], F32(0))]
        elif program in ("stencil2d", "stencil3d"):
            inner = n - 2
            if program == "stencil2d":
                grid, block, weight = (ceil_div(inner, 32), ceil_div(inner, 8)), (32, 8), F32(0.2)
            else:
                grid, block, weight = (
                    (ceil_div(inner, 32), ceil_div(inner, 8), inner),
                    (32, 8, 1),
                    F32(1) / F32(7),
                )
            kernel = k[program][grid, block]
            pairs = [(dev["a"], dev["b"]), (dev["b"], dev["a"])]
            steps = [
                (lambda src=pairs[t % 2][0], dst=pairs[t % 2][1]: kernel(n, src, dst, weight))
                for t in range(params["steps"])
            ]
        elif program in ("dot", "reduce"):
            return self._reduction(program, n, dev, data)
        else:
            raise KeyError(program)

        def launch() -> None:
            for step in steps:
                step()

        def fetch() -> Arrays:
            return {key: value.copy_to_host() for key, value in dev.items()}

        return Computation(launch, fetch, len(steps))

    def _reduction(self, program: str, n: int, dev: dict, data: Arrays) -> Computation:
        cuda = self.cuda
        blocks = min(ceil_div(n, self.block), self.reduction_blocks)
        if program == "dot":
            out = cuda.device_array(1, np.float64)

            def reset() -> None:
                out.copy_to_device(np.zeros(1, np.float64))

            def launch() -> None:
                self.kernels["dot"][blocks, self.block](n, dev["x"], dev["y"], out)

            def fetch() -> Arrays:
                return {**data, "dot": out.copy_to_host()[0]}

            return Computation(launch, fetch, 1, reset)
        total = cuda.device_array(1, np.int64)
        bounds = cuda.device_array(2, np.int32)
        start = np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min], np.int32)

        def reset() -> None:
            total.copy_to_device(np.zeros(1, np.int64))
            bounds.copy_to_device(start)

        def launch() -> None:
            self.kernels["reduce"][blocks, self.block](n, dev["x"], total, bounds)

        def fetch() -> Arrays:
            low, high = bounds.copy_to_host()
            return {**data, "sum": total.copy_to_host()[0], "min": low, "max": high}

        return Computation(launch, fetch, 1, reset)

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def time(self, launch: Callable[[], None]) -> float:
        cuda = self.cuda
        start, stop = cuda.event(), cuda.event()  # timing events by default
        cuda.synchronize()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3
