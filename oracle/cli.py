"""``tensorwasm fuzz``: differential fuzzing of a backend against wasmtime.

The ``tensorwasm`` command line (:mod:`tensorwasm.runtime.cli`) finds this module by name
and calls :func:`add_parser`; the subcommand's handler is set as ``run`` on its namespace
and returns the exit status (1 on any mismatch).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

from tensorwasm.oracle import GENERATOR_NAMES, REGRESSIONS

# The generators with a SIMD128 variant (oracle.generators.SIMD_GENERATORS), for --simd.
SIMD_GENERATOR_NAMES = ("numeric", "loops", "smith")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``fuzz`` subcommand to ``subparsers``; its handler is ``args.run(args) -> int``."""
    parser = subparsers.add_parser(
        "fuzz",
        help="compare a backend with wasmtime on generated programs",
        description="Differential fuzzing: generated Wasm programs run on wasmtime and on the backend; "
        "any difference in results, traps, memory or globals is a failure, shrunk and saved.",
    )
    parser.add_argument(
        "--backend",
        choices=["cpu", "gpu", "offload-cpu", "offload-sim", "offload-gpu"],
        default="cpu",
        help="backend under test (default cpu); offload-*: loops offloaded from wasmtime (offload-sim: "
        "the GPU path on a device simulated in host memory)",
    )
    parser.add_argument(
        "--generator", choices=[*GENERATOR_NAMES, "all"], default="all", help="generator family (default all)"
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, help="time budget, shared by the generators")
    budget.add_argument(
        "--max-examples",
        type=int,
        help="generated cases per generator (at least: the last modules may hold a few more)",
    )
    parser.add_argument(
        "--simd",
        action="store_true",
        help="generate SIMD128 programs: vector expression functions (numeric), vector loop kernels "
        f"(loops), wasm-smith modules with SIMD on (smith); all: {', '.join(SIMD_GENERATOR_NAMES)}",
    )
    parser.add_argument("--seed", type=int, help="random seed (default: a fresh one, printed)")
    parser.add_argument(
        "--jobs",
        type=int,
        help="processes fuzzing side by side, each with seeds of its own (default: one per CPU core "
        "for the cpu and offload-cpu backends, 1 for the GPU ones)",
    )
    parser.add_argument(
        "--save-dir",
        type=Path,
        default=REGRESSIONS,
        help=f"where shrunk failures are saved as .wat + .json (default {REGRESSIONS})",
    )
    parser.set_defaults(run=run_fuzz)
    return parser


def default_jobs(backend: str) -> int:
    """One process per CPU core this process may run on, for the host backends; one for the
    GPU backends (the processes would share one device)."""
    if backend.endswith("gpu"):
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_fuzz(args: argparse.Namespace) -> int:
    """Run ``tensorwasm fuzz``; the last stdout line is ``N passed, M failed`` (cases).

    A case is one generated program with the calls made to it (``docs/oracle.md``); one
    module batches several, so a line per generator, and one for all, gives cases, modules
    and calls.
    """
    from tensorwasm.oracle.fuzz import fuzz

    names = SIMD_GENERATOR_NAMES if args.simd else GENERATOR_NAMES
    generators = list(names) if args.generator == "all" else [args.generator]
    if args.generator not in (*names, "all"):
        print(
            f"error: the {args.generator} generator has no SIMD variant (--simd: {', '.join(names)})",
            file=sys.stderr,
        )
        return 2
    max_examples = args.max_examples
    if args.seconds is None and max_examples is None:
        max_examples = 100
    if args.backend.endswith("gpu"):  # gpu, offload-gpu: without a device every case would "fail"
        from tensorwasm.runtime import driver

        try:
            driver.Context.get()
        except Exception as exc:  # no device, no driver: one clear line, not a traceback
            print(f"error: the {args.backend} backend is not available: {exc}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    jobs = args.jobs if args.jobs is not None else default_jobs(args.backend)
    if jobs < 1:
        print(f"error: --jobs must be at least 1, not {jobs}", file=sys.stderr)
        return 2
    where = f"{jobs} processes" if jobs > 1 else "1 process"
    simd = " with SIMD128" if args.simd else ""
    print(
        f"fuzzing {', '.join(generators)}{simd} on the {args.backend} backend, seed {seed}, {where}",
        file=sys.stderr,
    )
    report, seed = fuzz(
        generators, args.backend, max_examples=max_examples, seconds=args.seconds, seed=seed,
        save_dir=args.save_dir, jobs=jobs, simd=args.simd,
    )  # fmt: skip
    print(f"seed: {seed}")
    for name, stats in report.by_generator.items():
        print(f"{name}: {_rates(stats)}")
        if stats.shapes:
            print(
                f"{name} shapes: "
                + ", ".join(f"{shape} {count}" for shape, count in sorted(stats.shapes.items()))
            )
    print(f"all: {_rates(report)}")  # in wall-clock time, the start of --jobs processes included
    for failure in report.failures:
        print(f"FAILED {failure.summary()}")
    print(f"{report.passed} passed, {len(report.failures)} failed")
    return 1 if report.failures else 0


def _rates(stats) -> str:
    seconds = max(stats.seconds, 1e-9)
    return (
        f"{stats.cases} cases ({stats.modules} modules), {stats.calls} calls compared in {stats.seconds:.1f} s: "
        f"{stats.cases / seconds:.1f} cases/s, {stats.calls / seconds:.1f} calls/s"
    )
