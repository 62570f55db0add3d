"""The fuzzing loop: Hypothesis drives a generator, the comparator judges each case.

One Hypothesis run per generator and chunk of examples, seeded explicitly (``--seed``),
without an example database, so a run is reproduced by its seed alone. When a case fails,
Hypothesis shrinks it, for at most ``shrink_seconds``, and replays the smallest failure
found last. That case is saved under the regression directory (``.wat`` + ``.json``).
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine as hypothesis_engine

from oracle.case import Case
from oracle.compare import ExecutorFactory, Outcome, make_factory, run_case
from oracle.generators import GENERATORS

log = logging.getLogger(__name__)

REGRESSIONS = Path(__file__).resolve().parents[1] / "tests" / "regressions"
CHUNK = 50  # examples per Hypothesis run when fuzzing for a time budget


@dataclass
class Failure:
    """A shrunk failing case, its mismatch and where it was saved (if it was)."""

    generator: str
    case: Case
    outcome: Outcome
    first: Case | None = None  # the failing case as generated, before shrinking
    saved: Path | None = None

    def summary(self) -> str:
        where = f" (saved {self.saved})" if self.saved else ""
        return f"[{self.generator}] {self.outcome.mismatch}{where}"


@dataclass
class Report:
    """Counts for one fuzzing session: examples (generated modules) and calls compared."""

    examples: int = 0
    calls: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    by_generator: dict[str, list[float]] = field(default_factory=dict)  # name -> [examples, calls, seconds]

    @property
    def passed(self) -> int:
        return self.examples


class _Failed(Exception):
    pass


def fuzz_generator(
    name: str,
    backend: str | ExecutorFactory = "cpu",
    *,
    max_examples: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    shrink_seconds: float = 20.0,
    save_dir: Path | None = None,
    report: Report | None = None,
    progress: Callable[[Report, str], None] | None = None,
) -> Report:
    """Fuzz with generator ``name`` until ``max_examples`` or ``seconds`` run out, or a failure.

    Returns the report (``report`` updated in place if given). A failure is shrunk and,
    with ``save_dir``, saved there.
    """
    report = report or Report()
    factory = make_factory(backend) if isinstance(backend, str) else backend
    strategy = GENERATORS[name]()
    start = time.perf_counter()
    stats = report.by_generator.setdefault(name, [0, 0, 0.0])
    chunk = 0
    while True:
        budget = max_examples - int(stats[0]) if max_examples is not None else CHUNK
        if budget <= 0 or (seconds is not None and time.perf_counter() - start >= seconds):
            break
        failure = _run_chunk(name, strategy, factory, min(budget, CHUNK), seed + chunk, shrink_seconds,
                             report, stats, start, seconds, progress)  # fmt: skip
        chunk += 1
        if failure is not None:
            if save_dir is not None:
                failure.saved = failure.case.save(save_dir)
            report.failures.append(failure)
            break
    stats[2] += time.perf_counter() - start
    report.seconds += time.perf_counter() - start
    return report


def _run_chunk(
    name: str,
    strategy,
    factory: ExecutorFactory,
    examples: int,
    seed: int,
    shrink_seconds: float,
    report: Report,
    stats: list[float],
    start: float,
    seconds: float | None,
    progress: Callable[[Report, str], None] | None,
) -> Failure | None:
    state: dict = {"best": None, "first": None}

    @settings(
        database=None,
        max_examples=examples,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(strategy)
    def check(case: Case) -> None:
        best = state["best"]
        if best is None and seconds is not None and time.perf_counter() - start >= seconds:
            return
        outcome = run_case(case, factory)
        if best is None:
            report.examples += 1
            report.calls += outcome.passed
            report.skipped += outcome.skipped
            stats[0] += 1
            stats[1] += outcome.passed
            if progress is not None:
                progress(report, name)
        if outcome.failed:
            if best is None:
                state["first"] = case
                report.examples -= 1  # counted as failed, not passed
                stats[0] -= 1
            state["best"] = (case, outcome)
            raise _Failed(outcome.mismatch)

    hypothesis_seed(seed)(check)
    try:
        with _shrink_limit(shrink_seconds):
            check()
    except _Failed:
        pass
    except Exception as exc:  # a Hypothesis error (e.g. every example rejected): report, go on
        log.warning("generator %s, seed %d: %s: %s", name, seed, type(exc).__name__, exc)
    if state["best"] is None:
        return None
    case, outcome = state["best"]
    return Failure(name, case, outcome, first=state["first"])


@contextmanager
def _shrink_limit(seconds: float) -> Iterator[None]:
    """Bound Hypothesis's shrinking time (its engine's own limit, 300 s by default, is the
    only knob it has; a shrink step here compiles a module, so minutes add up)."""
    old = hypothesis_engine.MAX_SHRINKING_SECONDS
    hypothesis_engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = old


def fuzz(
    generators: list[str],
    backend: str = "cpu",
    *,
    max_examples: int | None = None,
    seconds: float | None = None,
    seed: int | None = None,
    save_dir: Path | None = REGRESSIONS,
    stream: TextIO | None = sys.stderr,
) -> tuple[Report, int]:
    """Fuzz each generator in turn (``seconds`` shared evenly); the report and the seed used."""
    if seed is None:
        seed = random.randrange(1 << 32)
    report = Report()
    last = [0.0]

    def progress(rep: Report, name: str) -> None:
        now = time.perf_counter()
        if stream is not None and now - last[0] > 0.5:
            last[0] = now
            stream.write(
                f"\r[{name}] {rep.examples} cases passed, {len(rep.failures)} failed, "
                f"{rep.calls} calls compared, {rep.skipped} skipped"
            )
            stream.flush()

    share = seconds / len(generators) if seconds is not None else None
    for k, name in enumerate(generators):
        fuzz_generator(name, backend, max_examples=max_examples, seconds=share, seed=seed + 1000 * k,
                       save_dir=save_dir, report=report, progress=progress)  # fmt: skip
    if stream is not None:
        stream.write("\n")
    return report, seed
