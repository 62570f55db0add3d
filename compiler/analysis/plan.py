"""What the loop analysis decides, as data: a loop's plan, trip count, memory accesses,
reductions and live-outs, its report, and the analysis's options.

The analysis (:mod:`compiler.analysis.loops`) makes these; the outliner, the runtime's
guards and launches, and the prepared-module cache read them. They live apart from the
analysis so that a warm start, which unpickles them from the cache, does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.poly import Poly, Symbol

from tensorwasm.support.records import field, record

if TYPE_CHECKING:
    from tensorwasm.dialect.ir import Block, Function, LoopInfo, Op, Value


@record
class TripCount:
    """The loop runs while ``pred(start + step*k, bound)`` holds; ``top``: tested before the
    body of iteration k, else after it (a rotated loop runs at least once)."""

    top: bool
    pred: str
    start: Poly
    step: int
    bound: Poly
    bits: int

    def describe(self) -> str:
        """The trip count as a formula of the values at loop entry."""
        step = abs(self.step)
        diff = self.bound - self.start if self.step > 0 else self.start - self.bound
        if self.pred in ("sle", "ule", "sge", "uge"):
            diff = diff + Poly.const(1)
        count = f"({diff})" if step == 1 else f"ceil(({diff}) / {step})"
        if self.pred in ("ne", "eq"):
            count = f"({diff})" if step == 1 else f"({diff}) / {step}"
        return count if self.top else f"{count} + 1"


@record
class Access:
    op: Op
    store: bool
    width: int
    address: Poly | None  # None: not affine (a gather, say); the static offset included
    offset: int = 0  # the static offset: the rest of the address is Wasm's i32 operand
    # Counters of inner loops the access comes after rather than inside: it may see such a
    # counter at its exit value, one past the last iteration (a loop tested at its top).
    beyond: frozenset = frozenset()

    @property
    def where(self) -> str:
        return f"+0x{self.op.offset:x}" if self.op.offset is not None else "?"

    @property
    def kind(self) -> str:
        return "store" if self.store else "load"


@record
class Reduction:
    arg: Value  # the header argument
    op: str  # add, mul, and, or, xor, min_s, min_u, max_s, max_u, fadd, fmul
    update: Value  # its value on the back edge
    local: int | None = None
    init: Poly | None = None  # its value on entry (a constant or a live-in)


@record
class LiveOut:
    """How a local's value after the loop is found: ``kind`` is "affine" (``value`` at the
    exit iteration), "reduction" (``reduction``), or "dead" (not read after the loop)."""

    local: int
    kind: str
    value: Poly | None = None
    reduction: Reduction | None = None


@record
class Collapse:
    """A perfectly nested parallel inner loop, launched as one more grid dimension: each
    thread runs the enclosing iteration's code up to the inner loop, then one inner iteration."""

    loop: LoopInfo
    counter: Symbol
    trip: TripCount
    blocks: set[Block]  # the inner loop's body


@record
class LoopPlan:
    """What the outliner and the runtime need to run a loop as a kernel."""

    func: Function
    loop: LoopInfo
    counter: Symbol
    trip: TripCount
    inner_trips: list[tuple[Symbol, TripCount]]
    accesses: list[Access]
    reductions: list[Reduction]
    live_ins: list[tuple[Value, Symbol, str, int]]  # value, symbol, "local"/"global", index
    live_outs: list[LiveOut]
    blocks: set[Block]
    ivs: dict[Value, tuple[Poly, Poly]]  # header argument -> (entry value, step) for every loop in the nest
    invariant_args: dict[Value, Value]
    static_dependence_free: list[tuple[int, int]] = field(default_factory=list)
    # The inner loops launched as further grid dimensions, outer to inner: one for a 2-D
    # grid, two for a 3-D one; empty when inner loops run inside the thread.
    collapse: tuple[Collapse, ...] = ()
    # Ops per iteration, grouped by the inner loops that repeat them: the runtime's estimate
    # of the work is the sum of each group times those loops' trip counts.
    work: list[tuple[int, tuple[Symbol, ...]]] = field(default_factory=list)

    @property
    def gathers(self) -> list[Access]:
        """Loads whose address is not affine: checked in the kernel against the written
        ranges when the loop writes memory, and free to read anywhere when it does not."""
        return [a for a in self.accesses if a.address is None]


@record
class LoopReport:
    func: Function
    loop: LoopInfo
    verdict: str  # "offload" or "reject"
    reason: str
    trip: TripCount | None = None
    plan: LoopPlan | None = None

    def as_json(self) -> dict:
        return {
            "func": self.func.name,
            "offset": self.loop.offset,
            "depth": self.loop.depth,
            "trip_count": self.trip.describe() if self.trip else None,
            "verdict": self.verdict,
            "reason": self.reason,
        }


@record(frozen=True)
class AnalysisOptions:
    relaxed_float: bool = False  # allow float reductions (they reorder additions)
