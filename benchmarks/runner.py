"""The benchmark suite against its peers: ``python -m benchmarks``.

For each program of :data:`benchmarks.programs.PROGRAMS` and each size of the chosen set:

1. plain wasmtime runs the program (module compile and run timed apart);
2. ``tensorwasm run`` runs it twice in this process, first with an empty compiled-code cache
   (a new ``TENSORWASM_CACHE_DIR``), then warm (the same directory, read from disk as a new
   process would); each run's time is split into compile, transfers, kernels and the rest
   (wasmtime), from the run's :class:`runtime.offload.LoopStats`. Both outputs must equal
   wasmtime's, byte for byte; the JSON says whether they do. On the GPU, CUDA events around
   each launch give the kernels' device time as well;
3. on the GPU, the peers (:mod:`benchmarks.peers`) run the same kernels, each family in a
   process of its own, and the device's copy bandwidth is measured.

Times exclude the interpreter's start and the CUDA context's creation, which happen once
before the first measurement (the latter is recorded). Without a GPU, tensorwasm runs on the
host backend and the peers are skipped, with the reason printed and recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from importlib import metadata
from pathlib import Path
from typing import Any

import wasmtime

from benchmarks import first_line, source_commit
from benchmarks.peers import FAMILIES, KERNEL_PEERS
from benchmarks.programs import ROOT, SIZE_SETS, Params, Program, select

SCHEMA = 1
PACKAGES = ("wasmtime", "llvmlite", "numpy", "cuda-python", "cuda-bindings", "numba", "numba-cuda", "cupy",
            "cupy-cuda12x", "cupy-cuda13x", "nvidia-cuda-nvcc")  # fmt: skip


# -- environment --------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """What the numbers were measured on: machine, GPU, driver, toolkit, library versions."""
    from tensorwasm.compiler import COMPILER_VERSION

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "tensorwasm": {
            "compiler_version": COMPILER_VERSION,
            "commit": source_commit(),
        },
        "packages": {name: _version(name) for name in PACKAGES},
    }
    if device == "gpu":
        from benchmarks.peers.cuda_c import find_nvcc
        from tensorwasm.runtime import driver

        info = driver.device_info(0)
        major, minor = divmod(info.driver_version // 10, 100)
        nvcc = find_nvcc()
        env["gpu"] = {
            "name": info.name,
            "compute_capability": ".".join(map(str, info.compute_capability)),
            "multiprocessors": info.multiprocessor_count,
            "memory_bytes": info.total_memory,
            "cuda_driver_api": f"{major}.{minor}",
            "driver": first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "nvcc": _nvcc_release(nvcc) if nvcc else None,
        }
    return env


def _nvcc_release(nvcc: str) -> str | None:
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in done.stdout.splitlines() if "release" in line]
    return lines[-1].strip() if lines else None


# -- plain wasmtime -----------------------------------------------------------------------------


def run_wasmtime(path: Path, argv: list[str]) -> dict:
    """The program on plain wasmtime (WASI): compile and run seconds, exit status, output."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    with tempfile.TemporaryDirectory(prefix="tensorwasm-bench-") as tmp:
        out = Path(tmp, "stdout")
        wasi = wasmtime.WasiConfig()
        wasi.argv = [str(path), *argv]
        wasi.stdout_file = str(out)
        wasi.inherit_stderr()
        store.set_wasi(wasi)
        start = time.perf_counter()
        module = wasmtime.Module.from_file(engine, str(path))
        instance = linker.instantiate(store, module)
        compiled = time.perf_counter()
        status = 0
        try:
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap as exc:
            status = exc.code
        finished = time.perf_counter()
        output = out.read_text()
    return {
        "seconds": finished - start,
        "compile_seconds": compiled - start,
        "run_seconds": finished - compiled,
        "status": status,
        "output": output,
    }


# -- tensorwasm run -----------------------------------------------------------------------------


@contextmanager
def captured_stdout() -> Iterator[list[str]]:
    """Send file descriptor 1 (where WASI writes) to a file; the list gets its text."""
    text: list[str] = []
    sys.stdout.flush()
    fd = sys.stdout.fileno()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield text
        finally:
            sys.stdout.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read())


class LaunchEvents:
    """CUDA events recorded around every kernel launch the runtime makes, by kernel name.

    While active, :meth:`runtime.driver.Kernel.launch` is wrapped: an event is recorded on the
    launch's stream just before and just after it. The device time between the two is the
    kernel's, plus the few microseconds the host takes to submit the launch. Launches are
    not recorded as graphs meanwhile (a replay makes no launch call to time).
    """

    def __init__(self) -> None:
        self.pending: list[tuple[str, Any, Any]] = []
        self.error: str | None = None

    def __enter__(self) -> LaunchEvents:
        from cuda.bindings import driver as cu

        from tensorwasm.runtime import driver
        from tensorwasm.runtime.mirror import DeviceMirror

        original = driver.Kernel.launch
        pending = self.pending

        def event() -> Any:
            return driver.check("cuEventCreate", cu.cuEventCreate(0))

        def launch(kernel: Any, *args: Any, **kwargs: Any) -> None:
            stream = kwargs.get("stream", args[4] if len(args) > 4 else None) or 0
            kernel.module.context.bind()
            start, stop = event(), event()
            driver.check("cuEventRecord", cu.cuEventRecord(start, stream))
            original(kernel, *args, **kwargs)
            driver.check("cuEventRecord", cu.cuEventRecord(stop, stream))
            pending.append((kernel.name, start, stop))

        driver.Kernel.launch = launch
        DeviceMirror.RECORD = False  # every launch through Kernel.launch, none from a graph

        def restore() -> None:
            driver.Kernel.launch = original
            DeviceMirror.RECORD = True

        self._restore = restore
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def seconds(self) -> dict[str, dict[str, float]]:
        """Device seconds and launch count per kernel name; empty (with ``error`` set) when the
        events cannot be read, e.g. after a context reset."""
        from cuda.bindings import driver as cu

        from tensorwasm.runtime import driver

        totals: dict[str, dict[str, float]] = {}
        try:
            for name, start, stop in self.pending:
                driver.check("cuEventSynchronize", cu.cuEventSynchronize(stop))
                ms = driver.check("cuEventElapsedTime", cu.cuEventElapsedTime(start, stop))
                entry = totals.setdefault(name, {"seconds": 0.0, "launches": 0})
                entry["seconds"] += ms / 1e3
                entry["launches"] += 1
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return {}
        finally:
            for _, start, stop in self.pending:
                cu.cuEventDestroy(start)
                cu.cuEventDestroy(stop)
            self.pending.clear()
        return totals


def _fresh_cache_object() -> None:
    """Make the next :func:`runtime.cache.default_cache` a new object of the same directory,
    so a warm run reads the disk as a new process would, not this process's memory."""
    from tensorwasm.runtime.cache import default_cache

    directory = os.environ["TENSORWASM_CACHE_DIR"]
    with tempfile.TemporaryDirectory(prefix="tensorwasm-bench-") as other:
        os.environ["TENSORWASM_CACHE_DIR"] = other
        default_cache()
    os.environ["TENSORWASM_CACHE_DIR"] = directory


_STAT_FIELDS = ("arrivals", "offloaded", "iterations", "bytes_in", "bytes_out", "kernel_seconds",
                "transfer_seconds")  # fmt: skip


def _loop_record(loop: Any, device_times: dict[str, dict[str, float]]) -> dict:
    """One offloaded loop's statistics, with its kernel's event time where there is one."""
    stats = loop.stats
    record = {"func": stats.func, "offset": stats.offset, "entry": loop.entry}
    record.update({name: getattr(stats, name, 0) for name in _STAT_FIELDS})
    record["declined"] = dict(stats.declined)
    measured = device_times.get(loop.entry)
    record["device_seconds"] = measured["seconds"] if measured else None
    return record


def run_tensorwasm(program: Program, params: Params, device: str, offload: str) -> dict:
    """One ``tensorwasm run`` of the program in this process, with the current cache directory."""
    from tensorwasm.runtime.run import run

    argv = [str(program.wasm), *program.argv(params)]
    events = LaunchEvents() if device == "gpu" else None
    with captured_stdout() as text, events or nullcontext():
        status, prepared, timings = run(
            program.wasm.read_bytes(),
            argv,
            device=device,
            offload=offload,
            relaxed_float=program.relaxed_float,
        )
    prepared.kernels.wait()  # compiles still under way (untimed): their code lands in this cache
    device_times = events.seconds() if events is not None else {}
    loops = [_loop_record(loop, device_times) for loop in prepared.loops]
    kernel_seconds = sum(loop["kernel_seconds"] for loop in loops)
    transfer_seconds = sum(loop["transfer_seconds"] for loop in loops)
    # Each kernel compiles (or loads from the cache) at its first launch, inside the run.
    kernels_compile = prepared.kernels.counts.seconds
    compiled = max(1, len(prepared.kernels.units))
    result = {
        "status": status,
        "output": text[0],
        "seconds": timings["compile_seconds"] + timings["run_seconds"],
        "compile_seconds": timings["compile_seconds"] + kernels_compile,
        "compile_seconds_per_kernel": (timings["compile_seconds"] + kernels_compile) / compiled,
        "kernels_compiled": len(prepared.kernels.units),
        "cache_hit": prepared.cached,
        "run_seconds": timings["run_seconds"] - kernels_compile,
        "kernel_seconds": kernel_seconds,
        "transfer_seconds": transfer_seconds,
        # The rest of the run: the program on wasmtime (its module compile included).
        "on_wasmtime_seconds": max(
            0.0, timings["run_seconds"] - kernels_compile - kernel_seconds - transfer_seconds
        ),
        "launches": sum(loop["offloaded"] for loop in loops),
        "bytes_moved": sum(loop["bytes_in"] + loop["bytes_out"] for loop in loops),
        "kernel": _kernel_summary(program, loops),
        "loops": loops,
    }
    if events is not None and events.error:
        result["device_time_error"] = events.error
    return result


def _kernel_summary(program: Program, loops: list[dict]) -> dict:
    """The loops of the program's kernel function, added up."""
    mine = [loop for loop in loops if loop["func"] == program.kernel_function]
    declined: dict[str, int] = {}
    for loop in mine:
        for reason, count in loop["declined"].items():
            declined[reason] = declined.get(reason, 0) + count
    device = [loop["device_seconds"] for loop in mine if loop["offloaded"]]
    return {
        "loops": len(mine),
        "launches": sum(loop["offloaded"] for loop in mine),
        "arrivals": sum(loop["arrivals"] for loop in mine),
        "kernel_seconds": sum(loop["kernel_seconds"] for loop in mine),
        "transfer_seconds": sum(loop["transfer_seconds"] for loop in mine),
        "device_seconds": sum(device) if device and all(d is not None for d in device) else None,
        "declined": declined,
    }


def measure_program(program: Program, params: Params, device: str, offload: str) -> dict:
    """wasmtime, then tensorwasm with a cold and a warm cache, for one size."""
    row: dict[str, Any] = {
        "program": program.name,
        "category": program.category,
        "params": params,
        "label": program.label(params),
        "args": program.argv(params),
        "relaxed_float": program.relaxed_float,
        "bytes": program.bytes(params),
        "flops": program.flops(params),
    }
    row["wasmtime"] = run_wasmtime(program.wasm, program.argv(params))
    gc.collect()
    expected = row["wasmtime"]["output"]
    saved = os.environ.get("TENSORWASM_CACHE_DIR")
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tensorwasm-bench-cache-") as cache:
        os.environ["TENSORWASM_CACHE_DIR"] = cache
        try:
            for phase in ("cold", "warm"):
                if phase == "warm":
                    _fresh_cache_object()
                try:
                    runs[phase] = run_tensorwasm(program, params, device, offload)
                    runs[phase]["identical_output"] = (
                        runs[phase]["output"] == expected
                        and runs[phase]["status"] == row["wasmtime"]["status"]
                    )
                except Exception as exc:  # a failure of one run is a result, not the end of the suite
                    runs[phase] = {"error": f"{type(exc).__name__}: {exc}", "identical_output": False}
                gc.collect()  # the run's store and its linear memory (up to GiBs) go now, untimed
        finally:
            if saved is None:
                os.environ.pop("TENSORWASM_CACHE_DIR", None)
            else:
                os.environ["TENSORWASM_CACHE_DIR"] = saved
    row["tensorwasm"] = runs
    row["identical_output"] = all(run["identical_output"] for run in runs.values())
    row["peers"] = {}
    return row


# -- peers --------------------------------------------------------------------------------------


def run_family(family: str, size_set: str, programs: list[Program], timeout: float) -> dict:
    """One peer family in a process of its own; its JSON document, or why there is none."""
    with tempfile.TemporaryDirectory(prefix="tensorwasm-bench-peer-") as tmp:
        out = Path(tmp, "peer.json")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "benchmarks.peers", family, "--sizes", size_set,
                   "--programs", ",".join(p.name for p in programs), "--out", str(out)]  # fmt: skip
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"peer": family, "status": "error", "reason": f"timed out after {timeout:.0f} s"}
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return {"peer": family, "status": "error",
                    "reason": f"exit status {done.returncode}: " + " | ".join(tail)}  # fmt: skip
        return json.loads(out.read_text())


def attach_peers(rows: list[dict], documents: dict[str, dict]) -> None:
    """Put each peer's result for a program and size into that row, with whether the peer's
    output line equals wasmtime's."""
    for row in rows:
        for family in KERNEL_PEERS:
            document = documents.get(family)
            if document is None:
                continue
            if document.get("status") != "ok":
                row["peers"][family] = {"skipped" if document.get("status") == "skipped" else "error":
                                        document.get("reason", "")}  # fmt: skip
                continue
            entry = document.get("programs", {}).get(row["program"], {})
            if "skipped" in entry:
                row["peers"][family] = {"skipped": entry["skipped"]}
                continue
            size = next((s for s in entry.get("sizes", []) if s.get("params") == row["params"]), None)
            if size is None:
                row["peers"][family] = {"error": "no result for this size"}
                continue
            result = {k: v for k, v in size.items() if k != "params"}
            if "output" in result:
                result["identical_output"] = result["output"] == row["wasmtime"]["output"]
            result["check"] = entry.get("check")
            row["peers"][family] = result


def _peer_summary(document: dict) -> dict:
    """A peer's status, reason and versions, with its per-program checks (not its timings,
    which are in the rows)."""
    summary = {key: value for key, value in document.items() if key != "programs"}
    if document.get("programs"):
        summary["checks"] = {name: entry.get("check") for name, entry in document["programs"].items()}
    return summary


# -- main ---------------------------------------------------------------------------------------


def pick_device(requested: str) -> tuple[str, str | None]:
    """(device, why not the GPU) for ``--device auto|gpu|cpu``."""
    if requested == "cpu":
        return "cpu", "--device cpu"
    from tensorwasm.runtime import driver

    try:
        driver.Context.get()
    except driver.NoGPU as exc:
        return "cpu", str(exc)
    return "gpu", None


def _warm_up(device: str) -> float:
    """Compile one program once, uncounted, so one-time costs (LLVM's start, the driver's first
    JIT) are not charged to the first measurement."""
    from tensorwasm.runtime.offload import OffloadModule

    saved = os.environ.get("TENSORWASM_CACHE_DIR")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tensorwasm-bench-warmup-") as cache:
        os.environ["TENSORWASM_CACHE_DIR"] = cache
        try:
            prepared = OffloadModule((ROOT / "benchmarks/suite/build/saxpy.wasm").read_bytes(), device=device)
            close = getattr(prepared, "close", None)
            if close is not None:
                close()
        finally:
            if saved is None:
                os.environ.pop("TENSORWASM_CACHE_DIR", None)
            else:
                os.environ["TENSORWASM_CACHE_DIR"] = saved
    return time.perf_counter() - start


def _progress(row: dict) -> str:
    w = row["wasmtime"]
    parts = [f"{row['program']} {row['label']}: wasmtime {w['seconds']:.3f} s"]
    for phase, run in row["tensorwasm"].items():
        if "error" in run:
            parts.append(f"tensorwasm {phase} FAILED ({run['error']})")
            continue
        parts.append(
            f"tensorwasm {phase} {run['seconds']:.3f} s (compile {run['compile_seconds'] * 1e3:.0f} ms, "
            f"transfers {run['transfer_seconds'] * 1e3:.1f} ms, kernels {run['kernel_seconds'] * 1e3:.1f} ms)"
        )
    parts.append("identical output" if row["identical_output"] else "OUTPUT DIFFERS")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="The benchmark suite: wasmtime, tensorwasm and peers."
    )
    parser.add_argument("--sizes", choices=SIZE_SETS, default="small")
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--out", type=Path, default=Path("out/benchmarks"), help="directory for the JSON")
    parser.add_argument(
        "--simd", action="store_true", help="run the programs' -msimd128 builds (build/<name>.simd.wasm)"
    )
    parser.add_argument("--programs", default="all", help="comma-separated program names (default: all)")
    parser.add_argument("--peers", default=",".join(FAMILIES),
                        help="comma-separated peer families to run on the GPU (default: all)")  # fmt: skip
    parser.add_argument("--offload", choices=("auto", "always"), default="auto",
                        help="tensorwasm run's offload mode (default: auto, as the CLI)")  # fmt: skip
    parser.add_argument("--peer-timeout", type=float, default=300.0, help="seconds per peer family")
    args = parser.parse_args(argv)
    try:
        programs = select(args.programs)
    except ValueError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    families = [f for f in args.peers.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(
            f"benchmarks: no peer family {', '.join(unknown)} (have: {', '.join(FAMILIES)})", file=sys.stderr
        )
        return 2
    if args.simd:
        programs = [dataclasses.replace(p, simd=True) for p in programs]
    missing = [str(p.wasm.relative_to(ROOT)) for p in programs if not p.wasm.exists()]
    if missing:
        print(f"benchmarks: missing {', '.join(missing)}: run benchmarks/suite/build.sh", file=sys.stderr)
        return 2

    started = time.perf_counter()
    context_start = time.perf_counter()
    device, no_gpu = pick_device(args.device)
    context_seconds = time.perf_counter() - context_start
    if args.device == "gpu" and device != "gpu":
        print(f"benchmarks: --device gpu, but {no_gpu}", file=sys.stderr)
        return 2
    if no_gpu:
        print(f"benchmarks: tensorwasm runs on the host backend, peers skipped: {no_gpu}")
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "sizes": args.sizes,
        "device": device,
        "offload": args.offload,
        "simd": args.simd,
        "environment": environment(device),
        "startup": {
            "cuda_context_seconds": context_seconds if device == "gpu" else None,
            "warmup_seconds": _warm_up(device),
        },
    }
    rows = []
    for program in programs:
        for values in program.sizes[args.sizes]:
            row = measure_program(program, program.bind(values), device, args.offload)
            rows.append(row)
            print(_progress(row), flush=True)
    documents: dict[str, dict] = {}
    for family in families:
        if device != "gpu":
            documents[family] = {
                "peer": family,
                "status": "skipped",
                "reason": f"no GPU in this run ({no_gpu})",
            }
            continue
        peer_start = time.perf_counter()
        documents[family] = run_family(family, args.sizes, programs, args.peer_timeout)
        status = documents[family]["status"]
        reason = documents[family].get("reason")
        print(f"peer {family}: {status}{f' ({reason})' if reason else ''} "
              f"in {time.perf_counter() - peer_start:.1f} s", flush=True)  # fmt: skip
    attach_peers(rows, documents)
    document["peers"] = {family: _peer_summary(doc) for family, doc in documents.items()}
    copy = documents.get("copy", {})
    document["bandwidth"] = copy.get("gbps") if copy.get("status") == "ok" else None
    document["results"] = rows
    document["total_seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"benchmarks-{args.sizes}-{device}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    differ = [f"{r['program']} {r['label']}" for r in rows if not r["identical_output"]]
    print(f"wrote {path} ({document['total_seconds']:.0f} s); "
          + (f"OUTPUT DIFFERS for: {', '.join(differ)}" if differ else "every output identical to wasmtime's"))  # fmt: skip
    return 1 if differ else 0
