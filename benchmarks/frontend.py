"""Frontend throughput: decode + validate + translate + verify, in Wasm instructions per second.

Usage: ``python -m benchmarks.frontend [MODULE.wasm ...]`` (default: the largest module of the
example corpus). Reports the median of several runs, per stage and in total.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tensorwasm.compiler.frontend import decode, translate_module, validate

ROOT = Path(__file__).resolve().parents[1]


def measure(path: Path, repeat: int) -> dict:
    data = path.read_bytes()
    module = decode(data)
    instructions = sum(len(code.body) for code in module.codes)
    times: dict[str, list[float]] = {"decode": [], "validate": [], "translate+verify": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        module = decode(data)
        t1 = time.perf_counter()
        validate(data)
        t2 = time.perf_counter()
        translate_module(module, verify=True)
        t3 = time.perf_counter()
        times["decode"].append(t1 - t0)
        times["validate"].append(t2 - t1)
        times["translate+verify"].append(t3 - t2)
    medians = {k: statistics.median(v) for k, v in times.items()}
    total = sum(medians.values())
    return {
        "module": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
        "bytes": len(data),
        "functions": len(module.codes),
        "instructions": instructions,
        "seconds": medians,
        "instructions_per_second": round(instructions / total),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("modules", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args()
    modules = args.modules or [
        max((ROOT / "examples").glob("**/build/*.wasm"), key=lambda p: p.stat().st_size)
    ]
    results = [measure(p, args.repeat) for p in modules]
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    for r in results:
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r["seconds"].items())
        print(
            f"{r['module']}: {r['instructions']} instructions in {r['functions']} functions; "
            f"{stages}; {r['instructions_per_second']:,} instructions/s (target >= 100,000)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
