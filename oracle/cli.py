"""``tensorwasm fuzz``: differential fuzzing of a backend against wasmtime.

Wire it into the main parser with :func:`add_fuzz_parser`; the subcommand's handler is
set as ``func`` on its namespace and returns the exit status (1 on any mismatch).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from oracle.fuzz import REGRESSIONS, fuzz
from oracle.generators import GENERATORS


def add_fuzz_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``fuzz`` subcommand to ``subparsers``; its handler is ``args.func(args) -> int``."""
    parser = subparsers.add_parser(
        "fuzz",
        help="compare a backend with wasmtime on generated programs",
        description="Differential fuzzing: generated Wasm programs run on wasmtime and on the backend; "
        "any difference in results, traps, memory or globals is a failure, shrunk and saved.",
    )
    parser.add_argument(
        "--backend",
        choices=["cpu", "gpu", "offload-cpu", "offload-gpu"],
        default="cpu",
        help="backend under test (default cpu); offload-*: loops offloaded from wasmtime",
    )
    parser.add_argument(
        "--generator", choices=[*GENERATORS, "all"], default="all", help="generator family (default all)"
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, help="time budget, shared by the generators")
    budget.add_argument("--max-examples", type=int, help="generated cases per generator")
    parser.add_argument("--seed", type=int, help="random seed (default: a fresh one, printed)")
    parser.add_argument(
        "--save-dir",
        type=Path,
        default=REGRESSIONS,
        help=f"where shrunk failures are saved as .wat + .json (default {REGRESSIONS})",
    )
    parser.set_defaults(func=run_fuzz)
    return parser


def run_fuzz(args: argparse.Namespace) -> int:
    """Run ``tensorwasm fuzz``; the last stdout line is ``N passed, M failed``."""
    generators = list(GENERATORS) if args.generator == "all" else [args.generator]
    max_examples = args.max_examples
    if args.seconds is None and max_examples is None:
        max_examples = 100
    if args.backend == "gpu":
        from runtime import driver

        try:
            driver.Context.get()
        except Exception as exc:  # no device, no driver: one clear line, not a traceback
            print(f"error: the gpu backend is not available: {exc}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"fuzzing {', '.join(generators)} on the {args.backend} backend, seed {seed}", file=sys.stderr)
    report, seed = fuzz(
        generators, args.backend, max_examples=max_examples, seconds=args.seconds, seed=seed,
        save_dir=args.save_dir,
    )  # fmt: skip
    print(f"seed: {seed}")
    for name, (examples, calls, seconds) in report.by_generator.items():
        print(f"{name}: {int(examples)} cases, {int(calls)} calls compared in {seconds:.1f} s")
    for failure in report.failures:
        print(f"FAILED {failure.summary()}")
    print(f"{report.passed} passed, {len(report.failures)} failed")
    return 1 if report.failures else 0
