"""Compile latency: one Wasm function -> PTX (translate, lower, optimise, emit), cold; and
each offloaded loop's kernel as ``tensorwasm run`` compiles it at its first launch.

Usage: ``python -m benchmarks.compile [--target sm_90] [--max-instructions 200] [--json]``.
Every defined function of the example corpus with at most ``--max-instructions`` Wasm
instructions (and no host-import calls) is compiled on its own, in its own LLVM module,
several times; the report gives the median per function and over the corpus.

``--kernels``: every loop kernel of the example corpus (``--corpus suite``: of the benchmark
suite's programs), through the runtime's own path (:mod:`runtime.loop_kernels`, the host
backend, a code cache of its own): cold, its compile unit lowered, compiled and loaded at its
first launch (the module's preparation is not counted: it is paid once per module, and
cached); warm, read from the code cache by a new process's module and loaded. Also the same
units for ``--target`` as the GPU device compiles them, without a GPU: cold, to PTX and, where
ptxas is found, assembled to the cubin the first load then reads (the device's load itself,
``cuModuleLoadData``, not counted); warm, the PTX and the cubin read from the code cache.

``--threads N``: each module's kernels compiled for ``--target`` all at once on N threads
(as ``tensorwasm run``'s compile workers do), against one thread: the wall time per kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.frontend import translate_function
from tensorwasm.compiler.target import HostTarget, parse_target

ROOT = Path(__file__).resolve().parents[1]


CORPORA = {
    "examples": lambda: sorted((ROOT / "examples").glob("**/build/*.wasm")),
    "suite": lambda: sorted((ROOT / "benchmarks/suite/build").glob("*.wasm")),
}


def corpus_functions(max_instructions: int):
    """(path, its translated module, function index) of every function measured."""
    for path in sorted((ROOT / "examples").glob("**/build/*.wasm")):
        state = pipeline.run(pipeline.Request(path.read_bytes()), "dialect")
        wasm = state.wasm.module
        first = wasm.num_imported_funcs
        candidates = [first + i for i, code in enumerate(wasm.codes) if len(code.body) <= max_instructions]
        state = pipeline.run(pipeline.Request(functions=tuple(candidates)), "kernels", state=state)
        for index in state.kernels.functions:
            yield path, state, index


def measure(target_name: str, max_instructions: int, repeat: int) -> dict:
    target = parse_target(target_name)
    per_function = []
    for path, translated, index in corpus_functions(max_instructions):
        wasm = translated.wasm.module
        module = translated.dialect.module
        request = pipeline.Request(functions=(index,), target=target)
        last = "ptx" if target.is_gpu else "llvm"  # host: the IR, as the JIT's input
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            # The function translated afresh (so it is timed), in the module translated once.
            module.functions[index] = translate_function(wasm, index)
            state = pipeline.run(
                request, last, state=pipeline.CompileState(dialect=pipeline.DialectModule(module))
            )
            if target.is_gpu:
                assert state.ptx.text
            times.append(time.perf_counter() - start)
        per_function.append(
            {
                "module": str(path.relative_to(ROOT)),
                "function": wasm.func_name(index),
                "instructions": len(wasm.codes[index - wasm.num_imported_funcs].body),
                "median_ms": statistics.median(times) * 1e3,
            }
        )
    medians = [f["median_ms"] for f in per_function]
    return {
        "target": target_name,
        "functions": len(per_function),
        "median_ms": statistics.median(medians),
        "p90_ms": sorted(medians)[int(0.9 * (len(medians) - 1))],
        "max_ms": max(medians),
        "per_function": per_function,
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def _stand_in(offload, target) -> SimpleNamespace:
    """What :class:`runtime.loop_kernels.LoopKernels` reads of a module, for ``target``'s
    code (PTX where this machine has no GPU to make an OffloadModule for): with a GPU, the
    CUDA device of :func:`bench_device`, which assembles each kernel's cubin as it compiles."""
    gpu = target.is_gpu
    loops = [SimpleNamespace(kernel_index=lp.kernel_index, entry=lp.entry) for lp in offload.loops]
    backend = bench_device(target) if gpu else offload.backend
    return SimpleNamespace(code_kind="gpu" if gpu else "cpu", key=offload.key, target=target, loops=loops,
                           preparation=offload.preparation, mode="always", backend=backend)  # fmt: skip


def bench_device(target):
    """The CUDA device (:class:`runtime.cuda_device.CudaDevice`) as it is before its context
    exists, assuming a device of ``target``'s architecture and a driver as new as the ptxas
    found (so that ptxas assembles each kernel, as on the GPU machine). No CUDA call is made."""
    from tensorwasm.runtime import assembler
    from tensorwasm.runtime.cuda_device import CudaDevice
    from tensorwasm.runtime.device_info import DeviceInfo

    device = CudaDevice()
    found = assembler.ptxas()
    release = found[1] if found else (13, 0)
    capability = (int(target.arch[3]), int(target.arch[4]))
    device.assumed = DeviceInfo(0, "benchmark", capability, 1000 * release[0] + 10 * release[1], 0, 0)
    return device


def cached_cubin(device, ptx: bytes) -> bytes | None:
    """The cubin of ``ptx`` as a GPU's first load reads it from the code cache
    (:func:`runtime.cache.load_kernels`, before ``cuModuleLoadData``)."""
    from tensorwasm.runtime.cache import default_cache, device_cubin_key

    return default_cache().get("cubin", device_cubin_key(device.assumed, ptx))


def cpu_time() -> float:
    """This thread's CPU time and that of the child processes it waited for (ptxas)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


# The clock --kernels reads: "wall" (perf_counter, what a launch waits) or "cpu" (this
# thread's CPU time and ptxas's: the same work, steady on a machine that others load).
CLOCKS = {"wall": time.perf_counter, "cpu": cpu_time}
clock = time.perf_counter


def stage_times(preparation, target, index: int) -> dict[str, float]:
    """One cold compile of kernel ``index`` for ``target``, stage by stage (seconds): the
    lowering to LLVM IR text, LLVM parsing it, the optimisation pipeline, code generation,
    and on the host loading the object code (MCJIT)."""
    from tensorwasm.compiler import pipeline
    from tensorwasm.support.records import replace

    kernels = replace(preparation.state.kernels, loops=tuple(k for k in preparation.state.kernels.loops
                                                             if k.index == index))  # fmt: skip
    state = replace(preparation.state, kernels=kernels, llvm=None, ptx=None, native=None)
    times = {}
    start = clock()
    with pipeline.cycle_collection_paused():
        pipeline.run(replace(preparation.request, target=target), "llvm", state=state)
        times["lower"] = clock() - start
        start = clock()
        module = target.parse(state.llvm.text)
        times["parse"] = clock() - start
        start = clock()
        target.optimize(module)
        times["optimise"] = clock() - start
        start = clock()
        machine = target.target_machine()
        code = machine.emit_assembly(module) if target.is_gpu else machine.emit_object(module)
        times["codegen"] = clock() - start
        if not target.is_gpu:
            start = clock()
            target.jit(None, code)
            times["load"] = clock() - start
    if target.is_gpu and ptxas_path() is not None:
        times["ptxas"] = ptxas_seconds(code, target.arch)
    return times


def ptxas_path() -> str | None:
    from tensorwasm.compiler.target import find_ptxas

    return find_ptxas()


def ptxas_seconds(ptx: str, arch: str) -> float:
    """ptxas on ``ptx`` in a child process, as the runtime assembles a kernel before the
    driver loads it (runtime.assembler): at the first load on the GPU, after the compile."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="tw-ptxas-") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        start = time.perf_counter()
        subprocess.run([ptxas_path(), f"-arch={arch}", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
                       check=True, capture_output=True)  # fmt: skip
        return time.perf_counter() - start


def measure_kernels(
    target_name: str, repeat: int, limit: int | None = None, corpus: str = "examples"
) -> dict:
    """Per loop kernel of the corpus, through the runtime's own path (LoopKernels, a code
    cache of its own): cold and warm, on the host backend and for ``target_name`` (PTX and
    its cubin); and each stage's share of a cold compile (``limit``: the first kernels only)."""
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.loop_kernels import LoopKernels
    from tensorwasm.runtime.offload import OffloadModule

    ptx_target = parse_target(target_name)
    per_kernel: dict[tuple[str, int], dict[str, list[float]]] = {}
    stages: dict[str, dict[str, float]] = {"host": {}, "ptx": {}}
    for round_ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="tw-compile-") as tmp:
            os.environ["TENSORWASM_CACHE_DIR"] = tmp  # every kernel cold, then warm from here
            os.environ["TENSORWASM_COMPILE"] = "sync"  # timed where it runs
            for path in CORPORA[corpus]():
                module_name = str(path.relative_to(ROOT))
                if limit is not None and not _wanted(per_kernel, module_name, round_, limit):
                    continue
                data = path.read_bytes()
                cold = OffloadModule(data, device="cpu")
                cold_ptx = LoopKernels(_stand_in(cold, ptx_target))
                default_cache().memory.clear()
                warm = OffloadModule(data, device="cpu")  # as a new process: the cache's files
                warm_ptx = LoopKernels(_stand_in(cold, ptx_target))
                for lp, again in zip(cold.loops, warm.loops, strict=True):
                    name = (module_name, lp.kernel_index)
                    if limit is not None and name not in per_kernel and (round_ or len(per_kernel) >= limit):
                        continue
                    times = per_kernel.setdefault(name, {})
                    marks = [clock()]
                    cold.kernels[lp.entry]
                    marks.append(clock())
                    cold_ptx.unit(lp.kernel_index)  # (its cubin assembled too, where ptxas is)
                    marks.append(clock())
                    default_cache().memory.clear()
                    marks.append(clock())
                    warm.kernels[again.entry]
                    marks.append(clock())
                    ptx = warm_ptx.unit(lp.kernel_index).ptx
                    cubin_read = cached_cubin(warm_ptx.module.backend, ptx)
                    marks.append(clock())
                    if cubin_read is None and ptxas_path() is not None:
                        raise AssertionError(f"{module_name} kernel {lp.kernel_index}: no cubin cached")
                    for key, (a, b) in (("host_cold", (0, 1)), ("ptx_cold", (1, 2)), ("host_warm", (3, 4)),
                                        ("ptx_warm", (4, 5))):  # fmt: skip
                        times.setdefault(key, []).append((marks[b] - marks[a]) * 1e3)
                    if round_ == 0:
                        for kind, target in (("host", HostTarget()), ("ptx", ptx_target)):
                            for stage, seconds in stage_times(
                                cold.preparation(), target, lp.kernel_index
                            ).items():
                                stages[kind][stage] = stages[kind].get(stage, 0.0) + seconds
    kernels = [
        {"module": module, "kernel": index, **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}
        for (module, index), times in per_kernel.items()
    ]
    result: dict = {"kernels": len(kernels), "ptx_target": target_name, "clock": clock.__name__, "corpus": corpus,
                    "cubin": ptxas_path() is not None}  # fmt: skip
    for key in ("host_cold", "ptx_cold", "host_warm", "ptx_warm"):
        for name, value in _percentiles([k[f"{key}_ms"] for k in kernels]).items():
            result[f"{key}_{name}_ms"] = value
    for kind, seconds in stages.items():
        compiled = sum(v for k, v in seconds.items() if k != "ptxas")
        result[f"{kind}_stage_share"] = {k: v / compiled for k, v in seconds.items() if k != "ptxas"}
        if "ptxas" in seconds:
            result["ptxas_per_kernel_ms"] = seconds["ptxas"] / len(kernels) * 1e3
    result["per_kernel"] = kernels
    return result


def measure_parallel(target_name: str, threads: int, corpus: str = "examples") -> dict:
    """Each module's kernels for ``target_name`` (PTX, and its cubin where ptxas is found)
    compiled all at once on ``threads`` threads, and one by one on one thread, each from an
    empty cache: the wall time per kernel of each, over the corpus."""
    from concurrent.futures import ThreadPoolExecutor

    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.loop_kernels import LoopKernels
    from tensorwasm.runtime.offload import OffloadModule

    target = parse_target(target_name)
    seconds = {1: 0.0, threads: 0.0}
    count = 0
    for path in CORPORA[corpus]():
        with tempfile.TemporaryDirectory(prefix="tw-compile-") as tmp:
            os.environ["TENSORWASM_CACHE_DIR"] = tmp
            offload = OffloadModule(path.read_bytes(), device="cpu")
            offload.preparation()  # (paid once per module: not timed)
        indices = sorted({lp.kernel_index for lp in offload.loops})
        count += len(indices)
        for workers in seconds:
            with tempfile.TemporaryDirectory(prefix="tw-compile-") as tmp:
                os.environ["TENSORWASM_CACHE_DIR"] = tmp
                default_cache().memory.clear()
                kernels = LoopKernels(_stand_in(offload, target))
                start = time.perf_counter()
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(kernels.unit, indices))
                seconds[workers] += time.perf_counter() - start
    return {"corpus": corpus, "ptx_target": target_name, "kernels": count, "threads": threads,
            "one_thread_ms_per_kernel": seconds[1] / count * 1e3,
            "threads_ms_per_kernel": seconds[threads] / count * 1e3}  # fmt: skip


def _wanted(per_kernel: dict, module_name: str, round_: int, limit: int) -> bool:
    """Whether a module has kernels among the first ``limit`` (the first round picks them)."""
    if round_ == 0:
        return len(per_kernel) < limit
    return any(name == module_name for name, _ in per_kernel)


def kernels_summary(result: dict) -> str:
    def line(kind: str, label: str) -> str:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in result[f"{kind}_stage_share"].items())
        name = "host" if kind == "host" else "ptx"
        return (
            f"  {label}: cold median {result[f'{name}_cold_median_ms']:.1f} ms, p90 "
            f"{result[f'{name}_cold_p90_ms']:.1f} ms; warm median {result[f'{name}_warm_median_ms']:.2f} ms, "
            f"p90 {result[f'{name}_warm_p90_ms']:.2f} ms; cold by stage: {shares}"
        )

    cubin = " and its cubin (ptxas)" if result.get("cubin") else ""
    out = [
        f"loop kernels ({result['kernels']} of the {result.get('corpus', 'examples')} corpus), per kernel, "
        f"through runtime.loop_kernels, by {result['clock']} (targets: cold median <= 20 ms, warm <= 1 ms):",
        line(
            "ptx",
            f"PTX {result['ptx_target']}{cubin} (warm: both read from the code cache; the driver's "
            f"load not counted)",
        ),
        line("host", "host backend (warm: read from the code cache and loaded)"),
    ]
    if "ptxas_per_kernel_ms" in result:
        out.append(f"  ptxas alone (a child process, in the PTX cold time above): "
                   f"{result['ptxas_per_kernel_ms']:.1f} ms a kernel on average")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--max-instructions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="each loop kernel, as the runtime compiles it")
    parser.add_argument("--limit", type=int, default=None, help="--kernels: the first N kernels only")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="examples",
                        help="--kernels, --threads: the example programs, or the benchmark suite's")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None,
                        help="each module's kernels compiled at once on N threads, against one")  # fmt: skip
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="--kernels: wall time, or this thread's CPU time and ptxas's (steady on a loaded machine)",
    )
    args = parser.parse_args()
    if args.threads is not None:
        result = measure_parallel(args.target, args.threads, args.corpus)
        print(json.dumps(result, indent=2) if args.json else
              f"{result['kernels']} kernels of the {args.corpus} corpus for {args.target}, each module's "
              f"compiled at once: {result['one_thread_ms_per_kernel']:.1f} ms a kernel on one thread, "
              f"{result['threads_ms_per_kernel']:.1f} ms on {args.threads}")  # fmt: skip
        return 0
    if args.kernels:
        global clock
        clock = CLOCKS[args.clock]
        result = measure_kernels(args.target, args.repeat, args.limit, args.corpus)
        if args.json:
            json.dump(result, sys.stdout, indent=2)
            print()
        else:
            print(kernels_summary(result))
        return 0
    result = measure(args.target, args.max_instructions, args.repeat)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(
            f"compile latency ({args.target}, {result['functions']} functions of <= "
            f"{args.max_instructions} instructions): median {result['median_ms']:.1f} ms, "
            f"p90 {result['p90_ms']:.1f} ms, max {result['max_ms']:.1f} ms (target: median <= 20 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
