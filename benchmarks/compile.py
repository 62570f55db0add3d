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

from tensorwasm.compiler.frontend import load, translate_function, translate_module
from tensorwasm.compiler.pipeline import compilable, compile_entries
from tensorwasm.compiler.target import parse_target

ROOT = Path(__file__).resolve().parents[1]


def corpus_functions(max_instructions: int):
    for path in sorted((ROOT / "examples").glob("**/build/*.wasm")):
        wasm = load(path.read_bytes())
        module = translate_module(wasm)
        first = wasm.num_imported_funcs
        candidates = [first + i for i, code in enumerate(wasm.codes) if len(code.body) <= max_instructions]
        ok, _ = compilable(module, candidates)
        for index in ok:
            yield path, wasm, index


def measure(target_name: str, max_instructions: int, repeat: int) -> dict:
    target = parse_target(target_name)
    per_function = []
    for path, wasm, index in corpus_functions(max_instructions):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            func = translate_function(wasm, index)
            dialect_module = _module_with(wasm, index, func)
            compilation = compile_entries(dialect_module, target, [index])
            if target.is_gpu:
                assert compilation.ptx
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


def _module_with(wasm, index, func):
    """The translated module, reusing the fresh translation of ``index`` (so it is timed)."""
    module = _CACHE.get(id(wasm))
    if module is None:
        module = _CACHE[id(wasm)] = translate_module(wasm)
    module.functions[index] = func
    return module


_CACHE: dict[int, object] = {}


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
