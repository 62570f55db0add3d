"""The nvcc peer: ``kernels.cu`` compiled with ``nvcc -O3`` and run through TensorWasm's
own driver layer (:mod:`runtime.driver`), timed with CUDA events.

The module is compiled at run time for the device's architecture, to a cubin (loaded as
it is) or, where the driver refuses that cubin, to PTX for the driver's JIT. ``-fmad=false``
keeps every multiply and add rounded on its own, as Wasm rounds them.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.peers.harness import Computation, Peer, Skip, ceil_div
from benchmarks.peers.workloads import SAXPY_A, Arrays
from benchmarks.programs import Params

KERNELS = Path(__file__).with_name("kernels.cu")
ENTRIES = ("saxpy", "condmap", "dot", "reduce", "gemv", "gemm", "stencil2d", "stencil3d")
NVCC_FLAGS = ("-O3", "-fmad=false")
BLOCK = 256  # kernels.cu's BLOCK: threads per block of the 1-D and reduction kernels
I32 = ctypes.c_int


def find_nvcc() -> str | None:
    """nvcc on PATH, under $CUDA_HOME or /usr/local/cuda, or from the nvidia-cuda-nvcc wheel."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    try:
        import nvidia.cuda_nvcc  # the pip wheel of the CUDA compiler
    except ImportError:
        return None
    for root in nvidia.cuda_nvcc.__path__:
        if Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


class CudaC(Peer):
    """Hand-written CUDA C kernels, loaded and launched with :mod:`runtime.driver`."""

    name = "nvcc"

    def __init__(self) -> None:
        try:
            from tensorwasm.runtime import driver
        except ImportError as exc:
            raise Skip(f"cuda-python is not usable ({exc})") from None
        self.driver = driver
        try:
            self.context = driver.Context.get()
        except driver.NoGPU as exc:
            raise Skip(str(exc)) from None
        from cuda.bindings import driver as cu

        self.cu = cu
        self.nvcc = find_nvcc()
        if self.nvcc is None:
            raise Skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, nvidia-cuda-nvcc)")
        self.arch = self.context.info.arch
        self.nvcc_version = self._run_nvcc(["--version"]).strip().splitlines()[-1]
        self.module, self.loaded_as = self._build()
        self.kernels = {name: self.module.function(name) for name in ENTRIES}
        # Reductions: a grid of a few blocks per multiprocessor, each thread striding.
        self.reduction_blocks = 8 * self.context.info.multiprocessor_count
        self.context.bind()
        self.events = [self._check("cuEventCreate", cu.cuEventCreate(0)) for _ in range(2)]

    def versions(self) -> dict[str, str]:
        return {
            "nvcc": self.nvcc_version,
            "nvcc_flags": " ".join((*NVCC_FLAGS, f"-arch={self.arch}")),
            "loaded_as": self.loaded_as,
        }

    def _check(self, call: str, result: tuple):
        return self.driver.check(call, result)

    def _run_nvcc(self, args: list[str]) -> str:
        done = subprocess.run([self.nvcc, *args], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            log = (done.stderr or done.stdout).strip()[-2000:]
            raise RuntimeError(f"nvcc failed ({' '.join([self.nvcc, *args])}):\n{log}")
        return done.stdout

    def _build(self):
        """Compile kernels.cu; load the cubin, or the PTX where the driver refuses the cubin."""
        with tempfile.TemporaryDirectory(prefix="tensorwasm-nvcc-") as tmp:
            cubin = Path(tmp, "kernels.cubin")
            self._run_nvcc([*NVCC_FLAGS, f"-arch={self.arch}", "-cubin", "-o", str(cubin), str(KERNELS)])
            first_error = None
            if hasattr(self.context, "load_cubin"):
                try:
                    return self.context.load_cubin(cubin.read_bytes(), ENTRIES), "cubin"
                except self.driver.CudaError as exc:
                    if exc.sticky:
                        raise
                    first_error = exc
            ptx = Path(tmp, "kernels.ptx")
            self._run_nvcc([*NVCC_FLAGS, f"-arch={self.arch}", "-ptx", "-o", str(ptx), str(KERNELS)])
            reason = f" (the driver refused the cubin: {first_error})" if first_error else ""
            return self.context.load_module(ptx.read_bytes()), f"ptx, JIT-compiled by the driver{reason}"

    # -- device memory ---------------------------------------------------------------------------

    def _upload(self, array: np.ndarray):
        buffer = self.context.mem_alloc(max(array.nbytes, 8))
        self.context.memcpy_htod(buffer.ptr, np.ascontiguousarray(array))
        return buffer

    def _download(self, buffer, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.context.memcpy_dtoh(out, buffer.ptr)
        return out

    # -- the kernels -----------------------------------------------------------------------------

    def prepare(self, program: str, params: Params, data: Arrays) -> Computation:
        n = params["n"]
        bufs = {key: self._upload(value) for key, value in data.items()}
        k = self.kernels
        launches: list[Callable[[], None]] = []
        if program == "saxpy":
            args = [(I32, n), (ctypes.c_float, float(SAXPY_A)), bufs["x"], bufs["y"]]
            launches = [lambda: k["saxpy"].launch((ceil_div(n, BLOCK),), (BLOCK,), args)] * params["reps"]
        elif program == "condmap":
            args = [(I32, n), bufs["x"], bufs["y"]]
            launches = [lambda: k["condmap"].launch((ceil_div(n, BLOCK),), (BLOCK,), args)] * params["reps"]
        elif program == "gemv":
            args = [(I32, n), bufs["a"], bufs["x"], bufs["y"]]
            launches = [lambda: k["gemv"].launch((ceil_div(n, BLOCK),), (BLOCK,), args)]
        elif program == "gemm":
            args = [(I32, n), bufs["a"], bufs["b"], bufs["c"]]
            launches = [lambda: k["gemm"].launch((ceil_div(n, 16), ceil_div(n, 16)), (16, 16), args)]
        elif program in ("stencil2d", "stencil3d"):
            launches = self._stencil(program, params, bufs)
        elif program == "dot":
            return self._dot(n, bufs, data)
        elif program == "reduce":
            return self._reduce(n, bufs, data)
        else:
            raise KeyError(program)

        def launch() -> None:
            for one in launches:
                one()

        def fetch() -> Arrays:
            return {key: self._download(bufs[key], data[key]) for key in data}

        return Computation(launch, fetch, len(launches), release=lambda: self._free(bufs))

    def _stencil(self, program: str, params: Params, bufs: dict) -> list[Callable[[], None]]:
        n, inner = params["n"], params["n"] - 2
        kernel = self.kernels[program]
        if program == "stencil2d":
            grid, block = (ceil_div(inner, 32), ceil_div(inner, 8)), (32, 8)
        else:
            grid, block = (ceil_div(inner, 32), ceil_div(inner, 8), inner), (32, 8, 1)
        forward = [(I32, n), bufs["a"], bufs["b"]]
        backward = [(I32, n), bufs["b"], bufs["a"]]
        return [
            (lambda args=(forward if t % 2 == 0 else backward): kernel.launch(grid, block, args))
            for t in range(params["steps"])
        ]

    def _dot(self, n: int, bufs: dict, data: Arrays) -> Computation:
        out = self.context.mem_alloc(8)
        zero = np.zeros(1, np.float64)
        blocks = min(ceil_div(n, BLOCK), self.reduction_blocks)

        def reset() -> None:
            self.context.memcpy_htod(out.ptr, zero)

        def launch() -> None:
            self.kernels["dot"].launch((blocks,), (BLOCK,), [(I32, n), bufs["x"], bufs["y"], out])

        def fetch() -> Arrays:
            return {**data, "dot": self._download(out, zero)[0]}

        return Computation(launch, fetch, 1, reset, lambda: self._free({**bufs, "out": out}))

    def _reduce(self, n: int, bufs: dict, data: Arrays) -> Computation:
        total = self.context.mem_alloc(8)
        bounds = self.context.mem_alloc(8)
        zero = np.zeros(1, np.int64)
        start = np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min], np.int32)
        blocks = min(ceil_div(n, BLOCK), self.reduction_blocks)

        def reset() -> None:
            self.context.memcpy_htod(total.ptr, zero)
            self.context.memcpy_htod(bounds.ptr, start)

        def launch() -> None:
            args = [
                (I32, n),
                bufs["x"],
                total,
                (ctypes.c_uint64, bounds.ptr),
                (ctypes.c_uint64, bounds.ptr + 4),
            ]
            self.kernels["reduce"].launch((blocks,), (BLOCK,), args)

        def fetch() -> Arrays:
            low, high = self._download(bounds, start)
            return {**data, "sum": self._download(total, zero)[0], "min": low, "max": high}

        return Computation(
            launch, fetch, 1, reset, lambda: self._free({**bufs, "sum": total, "bounds": bounds})
        )

    @staticmethod
    def _free(bufs: dict) -> None:
        for buffer in bufs.values():
            buffer.free()

    # -- timing ----------------------------------------------------------------------------------

    def synchronize(self) -> None:
        self.context.synchronize()

    def time(self, launch: Callable[[], None]) -> float:
        cu = self.cu
        start, stop = self.events
        self.context.synchronize()
        self._check("cuEventRecord", cu.cuEventRecord(start, 0))
        launch()
        self._check("cuEventRecord", cu.cuEventRecord(stop, 0))
        self._check("cuEventSynchronize", cu.cuEventSynchronize(stop))
        return self._check("cuEventElapsedTime", cu.cuEventElapsedTime(start, stop)) / 1e3
