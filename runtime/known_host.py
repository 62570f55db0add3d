"""The loop kernels a module's last run here would have run on the host's threads, so that
the next run loads them while the program starts.

A host launch's start is loading LLVM's JIT with the kernel's object code (llvmlite's
import alone is ~17 ms on the 2-core development machine) and its first threads:
:data:`runtime.profit.STARTUP_SECONDS` charges 40 ms. A program whose loops on the host's
threads would gain less than that never pays for it (PolyBench's matrix-vector programs,
whose kernels take 5 to 40 ms on wasmtime). Where the last run's arrivals that would have
paid on the host's threads gained at least :data:`EARLY_GAIN_SECONDS` between them (the
host's start, which such a run pays anyway, only later), their kernels are remembered
(under the prepared module's key and the host processor), and the next run reads and loads
them on a compile worker as soon as the module is prepared: beside wasmtime's compile of
the module and the program's own start, on another core, so that they are ready when the
loops come instead of after the arrivals that paid for them. Where each of those kernels
has its shared library in the code cache (:mod:`compiler.target.shared`: no LLVM to load),
the bar is that library's start (:data:`CHEAP_EARLY_GAIN_SECONDS`), and the libraries load
on a thread of their own. A run whose loops gain less forgets them.

The record also keeps each kernel's measured pace on the host's threads standing in for a
GPU that had not started (what its last launch there took over what the host's cost model
said, :meth:`Gains.paced`): the model is a fixed share of wasmtime's time, off by 3x to 6x
for PolyBench's 2mm on an H200's host, and a launch that could wait for the CUDA context
instead runs on the host's threads only where they finish it first
(:class:`runtime.while_starting.HostWhileStarting`): the next run starts from the
measured pace, not the model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tensorwasm.compiler.target import HostTarget, describe
from tensorwasm.runtime.cache import default_cache, make_key
from tensorwasm.runtime.profit import LIBRARY_START_SECONDS, STARTUP_SECONDS
from tensorwasm.support import logs

log = logs.get_logger(__name__)

# What the arrivals that paid on the host's threads must gain between them (by what their
# launches took, or where a kernel did not launch by the host's cost model) for their
# kernels to be loaded early next time: the host's whole start. Loading them while the
# program starts is not free: importing llvmlite holds Python's lock, which the program's
# arrivals wait for. On the H100's 16-core host (A/B, 12 fresh processes each, medians),
# PolyBench LARGE with its kernels loaded early: mvt's kernel 26.4 -> 8.2 ms and its process
# 238 -> 248 ms; gemver 36.6 -> 17.7 ms, 257 -> 297 ms; gesummv 8.1 -> 4.7 ms, 209 -> 245 ms.
# So only a run whose host launches would have paid for the start anyway loads it early...
EARLY_GAIN_SECONDS = STARTUP_SECONDS["cpu"]
# ... unless every one of those kernels has its shared library in the code cache
# (compiler.target.shared): then loading them costs what their first launches would pay
# for it anyway (a millisecond each, no LLVM), moved off wasmtime's thread.
CHEAP_EARLY_GAIN_SECONDS = LIBRARY_START_SECONDS


class Gains:
    """What each kernel's arrivals (by index) gained on the host's threads in one run:
    measured where the kernel launched there, else by the host's cost model (arrivals that
    would have paid but found no kernel loaded)."""

    def __init__(self) -> None:
        self.modelled: dict[int, float] = {}
        self.measured: dict[int, float] = {}
        self.paces: dict[int, float] = {}  # per kernel: its last launch's measured / modelled time

    def paced(self, index: int, ratio: float) -> None:
        """Kernel ``index``'s launch took ``ratio`` times what the host's model said."""
        self.paces[index] = ratio

    def would_have(self, index: int, seconds: float) -> None:
        self.modelled[index] = self.modelled.get(index, 0.0) + seconds

    def launched(self, index: int, seconds: float) -> None:
        self.measured[index] = self.measured.get(index, 0.0) + seconds


# Runs in a row that leave a kernel measured slower on the host's threads parked there before
# its measurement is dropped and the cost model decides again (a run on a busy machine may
# have measured it).
PARKED_RUNS = 8


def last_run(module_key: str) -> tuple[tuple[int, ...], set[int], dict[int, float]]:
    """What the last runs of the prepared module ``module_key`` left for this one, from one
    read of its record: the kernels (by index) to load early (none where no run chose any),
    those whose launches on the host's threads were measured slower than wasmtime (by
    the cost model's estimate of it) in the last run that launched them, and the kernels'
    measured paces there (:meth:`Gains.paced`). A run parks the slower ones on wasmtime
    from their first arrival (see :meth:`runtime.offload.OffloadModule.
    load_host_kernels_early`), where within a run it takes two slower launches."""
    kept = _kept(module_key)
    slower = {index for index, (gain, measured, _) in kept["seconds"].items() if measured and gain < 0.0}
    return tuple(kept["load"]), slower, dict(kept["pace"])


def kernels_last_time(module_key: str) -> tuple[int, ...]:
    """The kernels to load early, of :func:`last_run`."""
    return last_run(module_key)[0]


def paces_last_time(module_key: str) -> dict[int, float]:
    """The kernels' measured paces on the host's threads, of :func:`last_run`."""
    return last_run(module_key)[2]


def slower_last_time(module_key: str) -> set[int]:
    """The kernels measured slower, of :func:`last_run`."""
    return last_run(module_key)[1]


def remember_kernels(module_key: str, gains: Gains, cheap: Callable[[int], bool] | None = None) -> None:
    """Keep, for the next run, the kernels whose arrivals gained on the host's threads (or
    would have), where together they gained at least :data:`EARLY_GAIN_SECONDS` (or
    :data:`CHEAP_EARLY_GAIN_SECONDS` where ``cheap`` says each of them loads from its shared
    library); else none. A kernel's measured gain (or loss) stands until it is measured
    again, or for :data:`PARKED_RUNS` runs that did not launch it: a kernel the model
    favours that ran slower on the host's threads is neither loaded nor launched for it, run
    after run. A kernel's pace stands until a launch measures it again."""
    kept = _kept(module_key)
    seconds = {index: (gain, False, 0) for index, gain in gains.modelled.items()}
    for index, (gain, measured, parked) in kept["seconds"].items():
        if measured and index not in gains.measured and parked + 1 < PARKED_RUNS:
            seconds[index] = (gain, True, parked + 1)
    seconds.update((index, (gain, True, 0)) for index, gain in gains.measured.items())
    paying = sorted(index for index, (gain, _, _) in seconds.items() if gain > 0.0)
    least = EARLY_GAIN_SECONDS
    if paying and cheap is not None and all(cheap(index) for index in paying):
        least = CHEAP_EARLY_GAIN_SECONDS
    load = paying if sum(seconds[index][0] for index in paying) >= least else []
    pace = {**kept["pace"], **gains.paces}
    record = {"load": load, "seconds": seconds, "pace": pace}
    if record != kept:
        blob = {
            "load": load,
            "seconds": {str(k): list(v) for k, v in seconds.items()},
            "pace": {str(k): v for k, v in pace.items()},
        }
        default_cache().put("host-kernels", _key(module_key), json.dumps(blob).encode())


def _kept(module_key: str) -> dict:
    """The record of the last run (``load``: the kernels chosen; ``seconds``: per kernel,
    its gain, whether it was measured, and the runs since that parked it; ``pace``: per
    kernel, its measured pace on the host's threads)."""
    empty: dict = {"load": [], "seconds": {}, "pace": {}}
    blob = default_cache().get("host-kernels", _key(module_key))
    if blob is None:
        return empty
    try:
        found = json.loads(blob)
        return {
            "load": [int(index) for index in found["load"]],
            "seconds": {
                int(k): (float(gain), bool(measured), int(parked))
                for k, (gain, measured, parked) in found["seconds"].items()
            },
            "pace": {int(k): _pace(v) for k, v in found.get("pace", {}).items()},
        }
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.info("dropping an unreadable record of host kernels: %s", exc)
        default_cache().drop("host-kernels", _key(module_key))
        return empty


def _pace(value: object) -> float:
    """A remembered pace: a positive finite ratio (ValueError otherwise)."""
    ratio = float(value)  # type: ignore[arg-type]
    if not 0.0 < ratio < float("inf"):
        raise ValueError(f"a pace of {ratio}")
    return ratio


def _key(module_key: str) -> str:
    return make_key("host-kernels", module_key, describe(HostTarget()))
