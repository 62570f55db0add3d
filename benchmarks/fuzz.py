"""Oracle throughput on the host backend: generated cases and compared calls per second.

    python -m benchmarks.fuzz [--seconds S] [--backend cpu|gpu]

A *case* is one generated module with its calls; a *call* is one exported-function call
compared with wasmtime (results, trap). Generation, both compilations and the comparison
of final memory and globals are all inside the timing.
"""

from __future__ import annotations

import argparse

from oracle.fuzz import fuzz_generator
from oracle.generators import GENERATORS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per generator (default 10)")
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    total_cases = total_calls = total_seconds = 0.0
    print(f"{'generator':<10} {'cases':>7} {'calls':>7} {'seconds':>8} {'cases/s':>8} {'calls/s':>8}")
    for name in GENERATORS:
        report = fuzz_generator(name, args.backend, seconds=args.seconds, seed=args.seed, save_dir=None)
        cases, calls, seconds = report.by_generator[name]
        total_cases, total_calls, total_seconds = (
            total_cases + cases,
            total_calls + calls,
            total_seconds + seconds,
        )
        failed = f"  FAILED: {report.failures[0].summary()}" if report.failures else ""
        print(
            f"{name:<10} {cases:>7.0f} {calls:>7.0f} {seconds:>8.1f} {cases / seconds:>8.1f} {calls / seconds:>8.1f}{failed}"
        )
    print(
        f"{'all':<10} {total_cases:>7.0f} {total_calls:>7.0f} {total_seconds:>8.1f} "
        f"{total_cases / total_seconds:>8.1f} {total_calls / total_seconds:>8.1f}"
    )


if __name__ == "__main__":
    main()
