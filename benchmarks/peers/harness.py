"""One peer family over the suite: a correctness check per program, then kernel timings.

A peer sets each program's kernel work up on the device (:meth:`Peer.prepare`) as a
:class:`Computation`: ``launch`` enqueues everything the program's kernel function does
(all passes, all time steps), ``fetch`` copies the results back. The harness runs it once
from fresh data (warm-up, and the output line, compared with wasmtime's by the runner),
then times :data:`REPEATS` more runs with the peer's device timer (CUDA events around the
launches) and keeps the median. Before the sizes, each program is checked at its small size
against the NumPy reference (:func:`benchmarks.peers.workloads.max_error`).

Every failure is caught where it happens and recorded (a program, a size, or the whole peer
when it cannot start), so one broken peer never stops the others.
"""

from __future__ import annotations

import statistics
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.peers import workloads
from benchmarks.peers.workloads import Arrays
from benchmarks.programs import Params, Program

#: Timed runs per size after the warm-up run.
REPEATS = 5
#: Largest relative error a peer's result may have at the check size.
TOLERANCE = 1e-4


class Skip(Exception):
    """The peer cannot run here (no GPU, a missing library or tool); the message says why."""


def _nothing() -> None:
    return None


@dataclass
class Computation:
    """One program's kernel work, set up on the device by a peer."""

    launch: Callable[[], None]
    fetch: Callable[[], Arrays]
    launches: int
    # Sets reduction outputs to their starting values before each launch (not timed).
    reset: Callable[[], None] = field(default=_nothing)
    release: Callable[[], None] = field(default=_nothing)


class Peer(ABC):
    """A way to run the suite's kernels on the GPU without TensorWasm."""

    name: str

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the libraries and tools this peer uses."""

    def unsupported(self, program: str) -> str | None:
        """Why this peer has no implementation of ``program``; None when it has one."""
        return None

    @abstractmethod
    def prepare(self, program: str, params: Params, data: Arrays) -> Computation:
        """Copy ``data`` to the device and return the program's kernel work."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all the peer's device work."""

    @abstractmethod
    def time(self, launch: Callable[[], None]) -> float:
        """Device seconds between events recorded before and after ``launch()``."""


def ceil_div(n: int, d: int) -> int:
    """``n / d`` rounded up: the blocks of ``d`` threads that cover ``n``."""
    return -(-n // d)


def describe(exc: BaseException) -> str:
    """One line for a failure: the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"


def _run_once(peer: Peer, program: str, params: Params) -> tuple[Computation, Arrays]:
    data = workloads.inputs(program, params)
    computation = peer.prepare(program, params, data)
    computation.reset()
    computation.launch()
    peer.synchronize()
    return computation, computation.fetch()


def check(peer: Peer, program: Program) -> dict:
    """Run ``program`` at its small size and compare with the NumPy reference."""
    params = program.bind(program.sizes["small"][0])
    computation, results = _run_once(peer, program.name, params)
    computation.release()
    error = workloads.max_error(program.name, params, results)
    return {"size": program.label(params), "max_error": error, "passed": error <= TOLERANCE}


def measure(peer: Peer, program: Program, params: Params) -> dict:
    """The output line from fresh data, then the median device time of the kernel work."""
    computation, results = _run_once(peer, program.name, params)
    try:
        output = workloads.output_line(program.name, params, results)
        times = []
        for _ in range(REPEATS):
            computation.reset()
            times.append(peer.time(computation.launch))
    finally:
        computation.release()
    return {
        "seconds": statistics.median(times),
        "min_seconds": min(times),
        "launches": computation.launches,
        "output": output,
    }


def run_peer(factory: Callable[[], Peer], name: str, programs: list[Program], size_set: str) -> dict:
    """The JSON document of one peer: its status, versions, and per-program results."""
    document: dict = {"peer": name, "status": "ok", "programs": {}}
    try:
        peer = factory()
        document["versions"] = peer.versions()
    except Skip as exc:
        return {**document, "status": "skipped", "reason": str(exc)}
    except Exception as exc:
        return {**document, "status": "error", "reason": describe(exc)}
    for program in programs:
        entry: dict = {}
        document["programs"][program.name] = entry
        reason = peer.unsupported(program.name)
        if reason:
            entry["skipped"] = reason
            continue
        try:
            entry["check"] = check(peer, program)
        except Exception as exc:
            entry["check"] = {"error": describe(exc)}
        entry["sizes"] = []
        for values in program.sizes[size_set]:
            params = program.bind(values)
            try:
                row = measure(peer, program, params)
            except Exception as exc:
                row = {"error": describe(exc)}
            entry["sizes"].append({"params": params, **row})
    return document
