"""The fuzzing loop: Hypothesis drives a generator, the comparator judges each case.

One Hypothesis run per generator and chunk of examples, seeded explicitly (``--seed``),
without an example database, so a run is reproduced by its seed alone: the chunks' sizes
do not depend on time, and a time limit ends the run between two examples. Each example is
one module holding several generated programs (the *cases* counted below); when one
fails, Hypothesis shrinks the module, for at most ``shrink_seconds``, down to the failing
program alone where it can, and replays the smallest failure found last. That case is
saved under the regression directory (``.wat`` + ``.json``).

Every module is compiled afresh: the compiled-code cache is off while fuzzing, since a
hit would run code that an earlier compiler made (and generated modules do not repeat).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import TextIO

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine as hypothesis_engine

from tensorwasm.oracle import REGRESSIONS
from tensorwasm.oracle.case import Case
from tensorwasm.oracle.compare import ExecutorFactory, Outcome, make_factory, run_case
from tensorwasm.oracle.generators import generator_strategy
from tensorwasm.support import logs

log = logs.get_logger(__name__)

CHUNK = 100  # examples (modules) per Hypothesis run at most
FIRST_CHUNK = 4  # the first run for a budget of cases, which measures the cases per module


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
class Stats:
    """Throughput counts. A *case* is one generated program (a function, a loop kernel, a
    wasm-smith module) with the calls made to it; a *module* batches one or more cases into
    one compilation; a *call* is one call compared with wasmtime."""

    cases: int = 0  # cases whose every call was compared and agreed, final state included
    cases_skipped: int = 0  # cases with a call that could not be compared (see oracle.compare)
    modules: int = 0
    calls: int = 0  # calls compared that agreed
    calls_skipped: int = 0
    seconds: float = 0.0
    shapes: dict[str, int] = field(default_factory=dict)  # loop kernels run, by PolyBench shape

    @property
    def generated(self) -> int:
        """Cases generated and run to the end (passed or skipped)."""
        return self.cases + self.cases_skipped

    def add(self, outcome: Outcome) -> None:
        """Count a module that passed."""
        self.cases += outcome.programs_passed
        self.cases_skipped += outcome.programs_skipped
        self.modules += 1
        self.calls += outcome.passed
        self.calls_skipped += outcome.skipped


@dataclass
class Report(Stats):
    """Counts for one fuzzing session, by generator too, and the failures found."""

    failures: list[Failure] = field(default_factory=list)
    by_generator: dict[str, Stats] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return self.cases


class _Failed(Exception):
    pass


class _EndRun(BaseException):
    """Ends a Hypothesis run when the time is up or the budget of cases is spent.
    Hypothesis takes an ``Exception`` for a failure, to shrink; anything else it lets
    through at once."""


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
    simd: bool = False,
) -> Report:
    """Fuzz with generator ``name`` (its SIMD128 variant where ``simd``) until ``max_examples`` cases (at least; the last modules
    may hold a few more) or ``seconds`` run out, or a failure.

    Returns the report (``report`` updated in place if given). A failure is shrunk and,
    with ``save_dir``, saved there.
    """
    report = report or Report()
    factory = make_factory(backend) if isinstance(backend, str) else backend
    strategy = generator_strategy(name, simd)
    start = time.perf_counter()
    stats = report.by_generator.setdefault(name, Stats())
    chunk = 0
    with _compile_everything():
        while True:
            examples = _chunk_size(stats, max_examples, seconds, time.perf_counter() - start)
            if examples <= 0:
                break
            modules = stats.modules
            failure = _run_chunk(name, strategy, factory, examples, seed + chunk, shrink_seconds,
                                 report, stats, start, seconds, progress, max_examples)  # fmt: skip
            chunk += 1
            if failure is not None:
                if save_dir is not None:
                    failure.saved = failure.case.save(save_dir)
                report.failures.append(failure)
                break
            if stats.modules == modules:  # every example rejected, or the time ran out
                if seconds is None or time.perf_counter() - start < seconds:
                    log.warning(
                        "generator %s, seed %d: a run of %d examples ran no module", name, seed, examples
                    )
                break
    elapsed = time.perf_counter() - start
    stats.seconds += elapsed
    report.seconds += elapsed
    return report


def _chunk_size(stats: Stats, max_examples: int | None, seconds: float | None, elapsed: float) -> int:
    """How many examples the next Hypothesis run makes (0: none, the budget is spent). For
    a budget of cases, enough for half of what is left, judged from the cases per module
    so far, so that the runs close in on it without passing it by more than a module."""
    if (max_examples is not None and stats.generated >= max_examples) or (
        seconds is not None and elapsed >= seconds
    ):
        return 0
    if max_examples is None:
        return CHUNK
    if stats.modules == 0:
        return FIRST_CHUNK
    per_module = max(1.0, stats.generated / stats.modules)
    return max(1, min(CHUNK, math.ceil((max_examples - stats.generated) / per_module / 2)))


def _run_chunk(
    name: str,
    strategy,
    factory: ExecutorFactory,
    examples: int,
    seed: int,
    shrink_seconds: float,
    report: Report,
    stats: Stats,
    start: float,
    seconds: float | None,
    progress: Callable[[Report, str], None] | None,
    budget: int | None = None,
) -> Failure | None:
    """Up to ``examples`` modules in one Hypothesis run; it stops early once ``budget`` cases
    have run (the estimate of cases per module that sized it can be far off: then it passes
    the budget by one module at most)."""
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
        verbosity=Verbosity.quiet,  # the failure is ours to report, shrunk case and all
    )
    @given(strategy)
    def check(case: Case) -> None:
        best = state["best"]
        if best is None and seconds is not None and time.perf_counter() - start >= seconds:
            raise _EndRun
        if best is None and budget is not None and stats.generated >= budget:
            raise _EndRun
        outcome = run_case(case, factory)
        if outcome.failed:
            if best is None:
                state["first"] = case
            state["best"] = (case, outcome)
            raise _Failed(outcome.mismatch)
        if best is None:
            report.add(outcome)
            stats.add(outcome)
            for kernel in case.meta.get("kernels", ()):
                if "shape" in kernel:
                    stats.shapes[kernel["shape"]] = stats.shapes.get(kernel["shape"], 0) + 1
            if progress is not None:
                progress(report, name)

    hypothesis_seed(seed)(check)
    try:
        with _shrink_limit(shrink_seconds):
            check()
    except (_Failed, _EndRun):
        pass
    except Exception as exc:  # a Hypothesis error (e.g. every example rejected): report, go on
        log.warning("generator %s, seed %d: %s: %s", name, seed, type(exc).__name__, exc)
    if state["best"] is None:
        return None
    case, outcome = isolate(*state["best"], factory)
    return Failure(name, case, outcome, first=state["first"])


def isolate(case: Case, outcome: Outcome, factory: ExecutorFactory) -> tuple[Case, Outcome]:
    """Leave out programs of a failing module while it still fails: first every program
    but the one whose call failed, then one program at a time. Hypothesis's shrinking
    does the same in the end, but in a time limit and without knowing what a program is;
    this step makes a saved failure a module of one program wherever one is enough."""
    while case.programs > 1 and case.subset is not None:
        failing = case.calls[outcome.failed_call].program if outcome.failed_call is not None else None
        tries = [[failing]] if failing is not None else []
        tries += [[j for j in range(case.programs) if j != k] for k in range(case.programs) if k != failing]
        for keep in tries:
            smaller = case.subset(keep)
            result = run_case(smaller, factory) if smaller is not None else None
            if result is not None and result.failed:
                case, outcome = smaller, result
                break
        else:
            break
    return case, outcome


@contextmanager
def _compile_everything() -> Iterator[None]:
    """Turn the compiled-code cache off (``TENSORWASM_CACHE=off``) for the duration."""
    old = os.environ.get("TENSORWASM_CACHE")
    os.environ["TENSORWASM_CACHE"] = "off"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TENSORWASM_CACHE"]
        else:
            os.environ["TENSORWASM_CACHE"] = old


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
    jobs: int = 1,
    simd: bool = False,
) -> tuple[Report, int]:
    """Fuzz each generator in turn (``seconds`` shared evenly); the report and the seed used.

    With ``jobs`` > 1, as many processes fuzz side by side, each with seeds of its own
    (``seed + k * JOB_SEED_STRIDE`` for job k), each generator for the same share of the
    wall-clock budget (start-up included) and ``max_examples`` split between them; their
    counts add up, and rates are per second of wall-clock time.
    """
    if seed is None:
        seed = random.randrange(1 << 32)
    progress = _progress_line(stream)
    if jobs > 1:
        report = _fuzz_jobs(generators, backend, max_examples, seconds, seed, save_dir, jobs, progress, simd)
    else:
        report = _fuzz_serial(generators, backend, max_examples, seconds, seed, save_dir, progress, simd)
    if stream is not None:
        stream.write("\n")
    return report, seed


def _fuzz_serial(
    generators: list[str],
    backend: str,
    max_examples: int | None,
    seconds: float | None,
    seed: int,
    save_dir: Path | None,
    progress: Callable[[Report, str], None] | None,
    simd: bool = False,
) -> Report:
    report = Report()
    share = seconds / len(generators) if seconds is not None else None
    for k, name in enumerate(generators):
        fuzz_generator(name, backend, max_examples=max_examples, seconds=share, seed=seed + 1000 * k,
                       save_dir=save_dir, report=report, progress=progress, simd=simd)  # fmt: skip
    return report


def _progress_line(stream: TextIO | None) -> Callable[[Report, str], None] | None:
    """A callback that reports progress on ``stream``: on a terminal one status line
    rewritten twice a second at most, elsewhere (a log) a line every 10 seconds."""
    if stream is None:
        return None
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    every, start, end = (0.5, "\r", "") if terminal else (PROGRESS_LOG_SECONDS, "", "\n")
    last = [time.perf_counter() if not terminal else 0.0]

    def progress(rep: Report, name: str) -> None:
        now = time.perf_counter()
        if now - last[0] > every:
            last[0] = now
            stream.write(
                f"{start}[{name}] {rep.cases} cases passed, {len(rep.failures)} failed, "
                f"{rep.calls} calls compared, {rep.cases_skipped} cases skipped{end}"
            )
            stream.flush()

    return progress


PROGRESS_LOG_SECONDS = 10.0


JOB_SEED_STRIDE = 1_000_003  # seeds of job k: seed + k * stride, far from the chunks' seed + n


def _fuzz_jobs(
    generators: list[str],
    backend: str,
    max_examples: int | None,
    seconds: float | None,
    seed: int,
    save_dir: Path | None,
    jobs: int,
    progress: Callable[[Report, str], None] | None,
    simd: bool = False,
) -> Report:
    """Fuzz in ``jobs`` processes; their reports merged. Each process is started afresh
    (spawn): the compiler and wasmtime start no threads before a fork that way."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    share = math.ceil(max_examples / jobs) if max_examples is not None else None
    spec = _JobSpec(generators, backend, share, seconds, time.time(), seed, save_dir, simd)
    workers = [context.Process(target=_job, args=(queue, k, spec), daemon=True) for k in range(jobs)]
    for worker in workers:
        worker.start()
    latest: dict[int, Report] = {}
    finished: dict[int, Report] = {}
    try:
        while len(finished) < jobs:
            try:
                kind, k, name, partial = queue.get(timeout=1.0)
            except Empty:
                # A job that exits cleanly has sent its report already; any other exit is a crash.
                for j, worker in enumerate(workers):
                    if j not in finished and worker.exitcode not in (None, 0):
                        raise RuntimeError(f"fuzzing job {j} died (exit status {worker.exitcode})") from None
                continue
            (finished if kind == "done" else latest)[k] = partial
            if progress is not None and kind == "progress":
                progress(_merge([finished.get(j, latest.get(j, Report())) for j in range(jobs)]), name)
    finally:
        for worker in workers:
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.kill()
    report = _merge([finished[k] for k in range(jobs)])
    report.seconds = time.time() - spec.started
    return report


@dataclass(frozen=True)
class _JobSpec:
    """What every process of a parallel session is given (``seed`` is the session's)."""

    generators: list[str]
    backend: str
    max_examples: int | None  # per process
    seconds: float | None  # of the session, from ``started`` (``time.time()``)
    started: float
    seed: int
    save_dir: Path | None
    simd: bool = False


def _job(queue, index: int, spec: _JobSpec) -> None:
    """Process ``index`` of a parallel session: fuzz until the shared deadline, then report."""
    last = [0.0]

    def progress(report: Report, name: str) -> None:
        now = time.perf_counter()
        if now - last[0] > 0.5:
            last[0] = now
            queue.put(("progress", index, name, report))

    seconds = max(0.0, spec.seconds - (time.time() - spec.started)) if spec.seconds is not None else None
    seed = spec.seed + index * JOB_SEED_STRIDE
    report = _fuzz_serial(
        spec.generators, spec.backend, spec.max_examples, seconds, seed, spec.save_dir, progress, spec.simd
    )
    queue.put(("done", index, "", report))


def _merge(reports: list[Report]) -> Report:
    """The sum of reports of processes that ran side by side: counts add up, per-generator
    times are the longest (the processes ran each generator at the same time)."""
    merged = Report()
    for report in reports:
        merged.failures += report.failures
        merged.seconds = max(merged.seconds, report.seconds)
        for name, stats in report.by_generator.items():
            total = merged.by_generator.setdefault(name, Stats())
            for into in (total, merged):
                into.cases += stats.cases
                into.cases_skipped += stats.cases_skipped
                into.modules += stats.modules
                into.calls += stats.calls
                into.calls_skipped += stats.calls_skipped
            total.seconds = max(total.seconds, stats.seconds)
            for shape, count in stats.shapes.items():
                total.shapes[shape] = total.shapes.get(shape, 0) + count
    return merged
