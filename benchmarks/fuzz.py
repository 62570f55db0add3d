"""Oracle throughput on the host backend: generated cases and compared calls per second.

    python -m benchmarks.fuzz [--seconds S] [--backend cpu|offload-cpu|gpu] [--seed N] [--jobs N]

A *case* is one generated program (a numeric or control function, a loop kernel with its
buffers, a wasm-smith module) with every call made to it; a *call* is one call compared
with wasmtime (results, trap); a *module* batches one or more cases into one compilation.
Generation, both compilations, the calls and the comparison of final memory and globals
are all inside the timing, and so is the start of the processes with ``--jobs``. Rates
are per second of wall-clock time (``docs/oracle.md``).
"""

from __future__ import annotations

import argparse

from tensorwasm.oracle.fuzz import Stats, fuzz
from tensorwasm.oracle.generators import GENERATORS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per generator (default 10)")
    parser.add_argument("--backend", choices=["cpu", "offload-cpu", "gpu"], default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="processes side by side (default 1)")
    args = parser.parse_args()
    names = list(GENERATORS)
    report, _ = fuzz(names, args.backend, seconds=args.seconds * len(names), seed=args.seed, save_dir=None,
                     stream=None, jobs=args.jobs)  # fmt: skip
    header = ("generator", "cases", "modules", "calls", "seconds", "cases/s", "calls/s")
    print(f"{args.backend} backend, {args.jobs} {'process' if args.jobs == 1 else 'processes'}")
    print("{:<10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8}".format(*header))
    for name in names:
        print(_row(name, report.by_generator[name]))
    print(_row("all", report))
    for failure in report.failures:
        print(f"FAILED {failure.summary()}")


def _row(name: str, stats: Stats) -> str:
    seconds = max(stats.seconds, 1e-9)
    return (
        f"{name:<10} {stats.cases:>7} {stats.modules:>7} {stats.calls:>7} {stats.seconds:>8.1f} "
        f"{stats.cases / seconds:>8.1f} {stats.calls / seconds:>8.1f}"
    )


if __name__ == "__main__":
    main()
