"""Compile latency: one Wasm function -> PTX (translate, lower, optimise, emit), cold.

Usage: ``python -m benchmarks.compile [--target sm_90] [--max-instructions 200] [--json]``.
Every defined function of the example corpus with at most ``--max-instructions`` Wasm
instructions (and no host-import calls) is compiled on its own, in its own LLVM module,
several times; the report gives the median per function and over the corpus.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--max-instructions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
