"""Compile latency: one Wasm function -> PTX (translate, lower, optimise, emit), cold; and
each offloaded loop's kernel as ``tensorwasm run`` compiles it at its first launch.

Usage: ``python -m benchmarks.compile [--target sm_90] [--max-instructions 200] [--json]``.
Every defined function of the example corpus with at most ``--max-instructions`` Wasm
instructions (and no host-import calls) is compiled on its own, in its own LLVM module,
several times; the report gives the median per function and over the corpus.

``--kernels``: every loop kernel of the example corpus, through the runtime's own path
(:mod:`runtime.loop_kernels`, the host backend, a code cache of its own): cold, its compile
unit lowered, compiled and loaded at its first launch (the module's preparation is not
counted: it is paid once per module, and cached); warm, read from the code cache by a new
process's module and loaded. Also the same units compiled to PTX for ``--target``, cold.
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

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.frontend import translate_function
from tensorwasm.compiler.target import parse_target

ROOT = Path(__file__).resolve().parents[1]


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


def measure_kernels(target_name: str, repeat: int) -> dict:
    """Per loop kernel of the corpus: cold and warm on the host backend, cold to PTX."""
    from tensorwasm.compiler.prepare import compile_loop_kernels
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.offload import OffloadModule

    target = parse_target(target_name)
    per_kernel: dict[tuple[str, int], dict[str, list[float]]] = {}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="tw-compile-") as tmp:
            os.environ["TENSORWASM_CACHE_DIR"] = tmp  # every kernel cold, then warm from here
            for path in sorted((ROOT / "examples").glob("**/build/*.wasm")):
                data = path.read_bytes()
                cold = OffloadModule(data, device="cpu")
                default_cache().memory.clear()
                warm = OffloadModule(data, device="cpu")  # as a new process: the cache's files
                for lp, again in zip(cold.loops, warm.loops, strict=True):
                    times = per_kernel.setdefault((str(path.relative_to(ROOT)), lp.kernel_index), {})
                    start = time.perf_counter()
                    cold.kernels[lp.entry]
                    middle = time.perf_counter()
                    compile_loop_kernels(cold.preparation(), target, [lp.kernel_index])
                    ptx = time.perf_counter()
                    warm.kernels[again.entry]
                    end = time.perf_counter()
                    for name, seconds in (
                        ("cold", middle - start),
                        ("ptx", ptx - middle),
                        ("warm", end - ptx),
                    ):
                        times.setdefault(name, []).append(seconds * 1e3)
    kernels = [
        {"module": module, "kernel": index, **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}
        for (module, index), times in per_kernel.items()
    ]

    def median(key: str) -> float:
        return statistics.median(k[key] for k in kernels)

    return {
        "kernels": len(kernels),
        "cold_ms": median("cold_ms"),
        "warm_ms": median("warm_ms"),
        "ptx_target": target_name,
        "ptx_cold_ms": median("ptx_ms"),
        "per_kernel": kernels,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--max-instructions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="each loop kernel, as the runtime compiles it")
    args = parser.parse_args()
    if args.kernels:
        result = measure_kernels(args.target, args.repeat)
        if args.json:
            json.dump(result, sys.stdout, indent=2)
            print()
        else:
            print(
                f"loop kernels ({result['kernels']} of the example corpus), median per kernel: cold "
                f"{result['cold_ms']:.1f} ms (host backend: lowered, compiled, loaded; target <= 20 ms), "
                f"warm {result['warm_ms']:.2f} ms (from the code cache, loaded; target <= 1 ms); "
                f"cold to PTX ({args.target}) {result['ptx_cold_ms']:.1f} ms"
            )
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
