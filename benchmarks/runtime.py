"""Runtime costs: cold vs warm start of offloaded kernels, and the per-call overhead.

Usage: ``python -m benchmarks.runtime [--device gpu|cpu|sim] [--json]`` (``sim``: the GPU
path, copies and launch arguments included, on a device simulated in host memory with the
host backend's kernels; see :mod:`oracle.simulated`).

- Cold vs warm: each example module is prepared for offload (analysis, outlining,
  compile, load) in a fresh process with an empty cache directory, then in another fresh
  process with the cache that run left behind. Reported per kernel; what a process pays
  once before its first module (importing the runtime, creating the CUDA context) is
  reported apart.
- Per-call overhead: a small offloaded loop (saxpy, 256 elements) is called many times.
  From its time per call are subtracted the same call of the original module on plain
  wasmtime and the kernel's own time (the same kernel launched directly, with its wait;
  its arguments made once). The calls go through wasmtime's raw call API: wasmtime-py's
  ``Func.__call__`` costs tens of microseconds itself (type lookups, a ``Val`` per
  argument), as much as everything measured here, and is reported apart. Also reported:
  the call with offload off and the filter unset, i.e. the host function a declined arrival
  costs, and the call in auto mode, where the Wasm-side filter keeps it from the host.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    *sorted((ROOT / "examples/loops/build").glob("*.O2.wasm")),
    *sorted((ROOT / "examples/wasi/build").glob("*.O2.wasm")),
]

_PREPARE = """
import json, sys, time
t0 = time.perf_counter()
from tensorwasm.runtime.offload import OffloadModule
imported = time.perf_counter()
if sys.argv[1] == "gpu":
    from tensorwasm.runtime.driver import Context
    Context.get().bind()
context = time.perf_counter()
rows = []
for path in sys.argv[2:]:
    start = time.perf_counter()
    prepared = OffloadModule(open(path, "rb").read(), device=sys.argv[1])
    prepared.kernels.load_all()  # each compiled and loaded at its first launch otherwise
    rows.append({"module": path, "kernels": len(prepared.loops), "seconds": time.perf_counter() - start})
print(json.dumps({"import_seconds": imported - t0, "context_seconds": context - imported, "rows": rows}))
"""


def prepare_in_fresh_process(device: str, cache_dir: str) -> dict:
    env = dict(os.environ, TENSORWASM_CACHE_DIR=cache_dir, TENSORWASM_CACHE="on")
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE, device, *map(str, MODULES)],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def cold_warm(device: str) -> dict:
    compile_bytecode()
    with tempfile.TemporaryDirectory() as cache:
        cold = prepare_in_fresh_process(device, cache)
        warm = prepare_in_fresh_process(device, cache)
    kernels = sum(r["kernels"] for r in cold["rows"])
    cold_s = sum(r["seconds"] for r in cold["rows"])
    warm_s = sum(r["seconds"] for r in warm["rows"])
    return {
        "modules": len(cold["rows"]), "kernels": kernels,
        "cold_ms_per_kernel": 1e3 * cold_s / kernels, "warm_ms_per_kernel": 1e3 * warm_s / kernels,
        "ratio": cold_s / warm_s,
        "import_ms": 1e3 * warm["import_seconds"], "context_ms": 1e3 * warm["context_seconds"],
    }  # fmt: skip


def raw_caller(store, func, params: list[tuple[str, float]]):
    """A call of ``func`` with ``params`` ((format, value): "i" an i32, "f" an f32) through
    wasmtime's unchecked call API, without wasmtime-py's per-call conversions."""
    import ctypes

    from wasmtime import _ffi as ffi

    values = (ffi.wasmtime_val_raw_t * max(1, len(params)))()
    for slot, (fmt, value) in zip(values, params, strict=True):
        ctypes.memmove(ctypes.addressof(slot), struct.pack("<" + fmt, value), 4)
    context, handle, trap = store._context(), ctypes.byref(func._func), ctypes.POINTER(ffi.wasm_trap_t)()

    def call(store=store) -> None:  # the store must outlive the call
        error = ffi.wasmtime_func_call_unchecked(context, handle, values, len(values), ctypes.byref(trap))
        if error or trap:
            raise RuntimeError("the benchmark's call failed or trapped")

    return call


def launch_overhead(device: str, calls: int = 2000, rounds: int = 5) -> dict:
    """Microseconds per call of a small offloaded loop, of the same call on plain wasmtime,
    and of the kernel's launch alone (each the best of ``rounds`` rounds of ``calls``)."""
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import instantiate, module_bytes

    wasm = module_bytes("blas1", "O2")

    def best(call) -> float:
        call()  # warm up: first allocation, page-locking
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times.append((time.perf_counter() - start) / calls)
        return min(times)

    def saxpy(mode: str | None, raw: bool = True, bound: bool = False, process: bool = False):
        prepared = None
        if mode is not None:
            on = device
            if process:  # as after a sticky fault: the GPU's work in a process of its own
                from tensorwasm.runtime.cuda_device import GpuProcessDevice

                on = GpuProcessDevice(0)
            elif device == "sim":
                from tensorwasm.oracle.simulated import SimulatedDevice

                on = SimulatedDevice()
            prepared = OffloadModule(wasm, device=on, mode=mode, pin=device == "gpu")
        store, inst = instantiate(prepared.rewritten if prepared else wasm, prepared)
        exports = inst.exports(store)
        if bound:  # the Wasm-side filters set as tensorwasm run sets them
            prepared.bind(store, exports)
        base = exports["scratch_base"](store)
        params = [("i", 256), ("f", 1.5), ("i", base), ("i", base + 1024)]
        if raw:
            call = raw_caller(store, exports["saxpy"], params)
        else:
            call = lambda: exports["saxpy"](store, *(v for _, v in params))  # noqa: E731
        return call, prepared, exports["memory"].data_ptr(store)

    call, prepared, memory = saxpy("always", bound=True)  # bound: replays may go native
    on = best(call)
    mirror = getattr(prepared, "mirror", None)
    recorded = 0 if mirror is None or mirror.graphs_off else len(mirror._graphs)
    prepared.collect_skipped()
    native = sum(lp.stats.native for lp in prepared.loops)
    kernel = best(_bare_launch(prepared, memory))
    prepared.close()
    off = best(saxpy("off")[0])
    filtered = best(saxpy("auto", bound=True)[0])  # 256 elements: kept from the host
    plain = best(saxpy(None)[0])
    plain_py = best(saxpy(None, raw=False)[0])
    after_fault = None
    if device == "gpu":
        call, prepared, _ = saxpy("always", bound=True, process=True)
        after_fault = best(call)
        prepared.close()
    return {
        "offloaded_call_us": on * 1e6, "declined_call_us": off * 1e6, "wasmtime_call_us": plain * 1e6,
        "wasmtime_py_call_us": plain_py * 1e6, "bare_launch_us": kernel * 1e6,
        "hook_us": (off - plain) * 1e6, "filtered_us": (filtered - plain) * 1e6,
        "runtime_overhead_us": (on - plain - kernel) * 1e6,
        "graphs_recorded": recorded, "native_replays": native,
        "gpu_process_call_us": after_fault and after_fault * 1e6,
    }  # fmt: skip


def _bare_launch(prepared, memory):
    """The offloaded loop's kernel launched with the arguments of its last arrival (made
    once), and the wait for it; on the host backend, one call of its entry on ``memory``."""
    import ctypes

    from tensorwasm.compiler.lower import abi
    from tensorwasm.runtime.device_launch import device_arguments

    loop = next(lp for lp in prepared.loops if lp.stats.offloaded)
    ((_, ready),) = prepared.planner.guard_cache[loop.kernel_index].items()
    ((_, arrival),) = ready._arrivals.items()
    kernel, counts = prepared.kernels[loop.entry], (ready.launch.trip, *ready.launch.nest)
    if prepared.device != "gpu":
        ctx_image, _ = prepared.launches.host_arguments(ready)
        ctx = (ctypes.c_uint64 * (len(ctx_image) // 8)).from_buffer_copy(ctx_image)
        ctx[abi.CTX_MEM_BASE] = ctypes.cast(memory, ctypes.c_void_p).value
        out = (ctypes.c_uint64 * max(1, ready.reductions))()
        params = arrival.params
        return lambda: kernel(
            ctypes.addressof(ctx), ctypes.addressof(params), 0, *counts, ctypes.addressof(out)
        )
    mirror = prepared.mirror
    _, params = device_arguments(ready, mirror, arrival)

    def launch() -> None:
        kernel.launch(ready.grid, ready.block, params, stream=mirror.stream.handle)
        mirror.synchronize()

    return launch


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu", "sim"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    prepare_on = "cpu" if args.device == "sim" else args.device
    result = {"cold_warm": cold_warm(prepare_on), "launch": launch_overhead(args.device)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cw, ln = result["cold_warm"], result["launch"]
    print(
        f"cold vs warm ({cw['modules']} modules, {cw['kernels']} kernels, {args.device}): "
        f"{cw['cold_ms_per_kernel']:.2f} ms -> {cw['warm_ms_per_kernel']:.2f} ms per kernel ({cw['ratio']:.1f}x); "
        f"before the first module, once per process: imports {cw['import_ms']:.0f} ms, "
        f"CUDA context {cw['context_ms']:.0f} ms"
    )
    print(
        f"per offloaded call: {ln['offloaded_call_us']:.1f} us; the original module on wasmtime "
        f"{ln['wasmtime_call_us']:.1f} us; bare kernel launch+wait {ln['bare_launch_us']:.1f} us; "
        f"runtime overhead {ln['runtime_overhead_us']:.1f} us ({ln['graphs_recorded']} launch graph(s) recorded "
        f"and replayed, {ln['native_replays']} of the calls replayed in native code)"
    )
    print(
        f"a declined arrival costs {ln['hook_us']:.1f} us over wasmtime where the host decides, "
        f"{ln['filtered_us']:.2f} us where the Wasm-side filter keeps it from the host; wasmtime-py's own "
        f"Func.__call__ of the same call: {ln['wasmtime_py_call_us']:.1f} us (raw: {ln['wasmtime_call_us']:.1f} us)"
    )
    if ln["gpu_process_call_us"] is not None:
        print(
            f"per offloaded call through a GPU process of its own (as after a sticky fault): "
            f"{ln['gpu_process_call_us']:.1f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
