"""Runtime costs: cold vs warm start of offloaded kernels, and the per-launch overhead.

Usage: ``python -m benchmarks.runtime [--device gpu|cpu] [--json]``.

- Cold vs warm: each example module is prepared for offload (analysis, outlining,
  compile, load) in a fresh process with an empty cache directory, then in another fresh
  process with the cache that run left behind. Reported per kernel.
- Per-launch overhead: a small offloaded loop (saxpy, 256 elements) is called many times
  through wasmtime; from its mean time per call are subtracted the same call with offload
  off (wasmtime's own cost) and the kernel's own time (the same kernel launched directly
  through the driver, with its synchronisation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    *sorted((ROOT / "examples/loops/build").glob("*.O2.wasm")),
    *sorted((ROOT / "examples/wasi/build").glob("*.O2.wasm")),
]

_PREPARE = """
import json, sys, time
t0 = time.perf_counter()
from runtime.offload import OffloadModule
imported = time.perf_counter()
rows = []
for path in sys.argv[2:]:
    start = time.perf_counter()
    prepared = OffloadModule(open(path, "rb").read(), device=sys.argv[1])
    rows.append({"module": path, "kernels": len(prepared.loops), "seconds": time.perf_counter() - start})
print(json.dumps({"import_seconds": imported - t0, "rows": rows}))
"""


def prepare_in_fresh_process(device: str, cache_dir: str) -> dict:
    env = dict(os.environ, TENSORWASM_CACHE_DIR=cache_dir, TENSORWASM_CACHE="on")
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE, device, *map(str, MODULES)],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def cold_warm(device: str) -> dict:
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
    }  # fmt: skip


def launch_overhead(device: str, calls: int = 2000) -> dict:
    """Mean microseconds per offloaded call beyond wasmtime's call and the kernel itself."""
    import ctypes

    from runtime.offload import OffloadModule
    from tests.offload_cases import instantiate, module_bytes

    wasm = module_bytes("blas1", "O2")

    def per_call(mode: str) -> tuple[float, OffloadModule]:
        prepared = OffloadModule(wasm, device=device, mode=mode, pin=True)
        store, inst = instantiate(prepared.rewritten, prepared)
        saxpy = inst.exports(store)["saxpy"]
        base = inst.exports(store)["scratch_base"](store)
        args = (256, 1.5, base, base + 1024)
        saxpy(store, *args)  # warm up: first allocation, page-locking
        start = time.perf_counter()
        for _ in range(calls):
            saxpy(store, *args)
        return (time.perf_counter() - start) / calls, prepared

    on, prepared = per_call("always")
    off, _ = per_call("off")
    kernel_only = 0.0
    if device == "gpu":
        from compiler.lower import abi

        loop = next(lp for lp in prepared.loops if lp.stats.offloaded)
        mirror, kernel = prepared.mirror, prepared.kernels[loop.entry]
        mirror.ensure(1 << 16, abi.CTX_SLOTS + 64)
        ctx = (ctypes.c_uint64 * abi.CTX_SLOTS)()
        ctx[abi.CTX_MEM_BASE] = mirror.memory.ptr
        ctx[abi.CTX_MEM_SIZE] = ctx[abi.CTX_MEM_CAPACITY] = 1 << 16
        (ctx_ptr,) = mirror.upload_scratch([ctx])
        args = [(ctypes.c_uint64, ctx_ptr), (ctypes.c_uint64, ctx_ptr), (ctypes.c_int64, 0),
                (ctypes.c_uint64, ctx_ptr)]  # fmt: skip
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            kernel.launch((1, 1, 1), (256, 1, 1), args)
            prepared.context.synchronize()
            times.append(time.perf_counter() - start)
        kernel_only = statistics.mean(times)
    return {
        "offloaded_call_us": on * 1e6, "wasmtime_call_us": off * 1e6, "bare_launch_us": kernel_only * 1e6,
        "runtime_overhead_us": (on - off - kernel_only) * 1e6,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    result = {"cold_warm": cold_warm(args.device), "launch": launch_overhead(args.device)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cw, ln = result["cold_warm"], result["launch"]
    print(
        f"cold vs warm ({cw['modules']} modules, {cw['kernels']} kernels, {args.device}): "
        f"{cw['cold_ms_per_kernel']:.2f} ms -> {cw['warm_ms_per_kernel']:.2f} ms per kernel ({cw['ratio']:.1f}x)"
    )
    print(
        f"per offloaded call: {ln['offloaded_call_us']:.1f} us; wasmtime alone {ln['wasmtime_call_us']:.1f} us; "
        f"bare kernel launch+sync {ln['bare_launch_us']:.1f} us; runtime overhead {ln['runtime_overhead_us']:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
