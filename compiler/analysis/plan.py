"""What the loop analysis decides, as data: a loop's plan, trip count, memory accesses,
reductions and live-outs, its report, and the analysis's options; and the kinds of
reduction, one table row each with what the analysis, the outliner, the lowering and the
runtime need of it.

The analysis (:mod:`compiler.analysis.loops`) makes these; the outliner, the runtime's
guards and launches, and the prepared-module cache read them. They live apart from the
analysis so that a warm start, which unpickles them from the cache, does not import it.
"""

from __future__ import annotations

import enum
import operator
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.support.records import field, record

if TYPE_CHECKING:
    from tensorwasm.dialect.ir import Block, Function, LoopInfo, Op, Value
    from tensorwasm.dialect.types import Type


@record(frozen=True)
class ReductionTraits:
    """What the compiler needs of one kind of reduction (a row of :class:`ReductionKind`)."""

    dialect_op: str  # the dialect op whose chain the analysis recognises; "arith.select": a min/max
    is_float: bool  # reorders roundings: a reduction only under relaxed float semantics
    identity: dict[int, int]  # bit width -> the identity element's bits (x OP identity == x)
    host_op: Callable  # the operation on Python values (ints, or numpy floats for a float kind)
    builder: str = ""  # the llvmlite IRBuilder method folding two values; "": compare and select
    compare: str = ""  # min/max: the icmp predicate under which the left value is kept
    signed: bool = False  # min/max: compared as signed integers
    atomic: str | None = None  # the atomicrmw operation folding into a slot; None: compare-and-swap


class ReductionKind(enum.StrEnum):
    """The operator of a recognised reduction. Its value is the name the reports print (and
    that the runtime compared before the enum existed); ``kind.traits`` is its row."""

    def __new__(cls, value: str, traits: ReductionTraits) -> ReductionKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.traits = traits
        return member

    traits: ReductionTraits

    # fmt: off
    ADD = "add", ReductionTraits("arith.add", False, {32: 0, 64: 0}, operator.add, "add", atomic="add")
    MUL = "mul", ReductionTraits("arith.mul", False, {32: 1, 64: 1}, operator.mul, "mul")
    AND = "and", ReductionTraits("arith.and", False, {32: (1 << 32) - 1, 64: (1 << 64) - 1}, operator.and_,
                                 "and_", atomic="and")
    OR = "or", ReductionTraits("arith.or", False, {32: 0, 64: 0}, operator.or_, "or_", atomic="or")
    XOR = "xor", ReductionTraits("arith.xor", False, {32: 0, 64: 0}, operator.xor, "xor", atomic="xor")
    MIN_S = "min_s", ReductionTraits("arith.select", False, {32: (1 << 31) - 1, 64: (1 << 63) - 1}, min,
                                     compare="<", signed=True, atomic="min")
    MIN_U = "min_u", ReductionTraits("arith.select", False, {32: (1 << 32) - 1, 64: (1 << 64) - 1}, min,
                                     compare="<", atomic="umin")
    MAX_S = "max_s", ReductionTraits("arith.select", False, {32: 1 << 31, 64: 1 << 63}, max,
                                     compare=">", signed=True, atomic="max")
    MAX_U = "max_u", ReductionTraits("arith.select", False, {32: 0, 64: 0}, max, compare=">", atomic="umax")
    # -0.0, not +0.0: x + -0.0 is x for every x, +0.0 included.
    FADD = "fadd", ReductionTraits("arith.fadd", True, {32: 0x80000000, 64: 0x8000000000000000}, operator.add,
                                   "fadd", atomic="fadd")
    FMUL = "fmul", ReductionTraits("arith.fmul", True, {32: 0x3F800000, 64: 0x3FF0000000000000}, operator.mul,
                                   "fmul")
    # fmt: on

    @property
    def is_float(self) -> bool:
        """A float reduction: it reorders roundings, so only relaxed float semantics allow it."""
        return self.traits.is_float

    def identity(self, bits: int) -> int:
        """The identity element over values of ``bits`` bits, as a bit pattern."""
        return self.traits.identity[bits]

    def fold_bits(self, a: int, b: int, bits: int) -> int:
        """``a OP b`` on bit patterns of ``bits`` bits, as the kernels compute it (integers
        wrap; a float operation rounds once, in IEEE arithmetic of its width)."""
        mask = (1 << bits) - 1
        a &= mask
        b &= mask
        traits = self.traits
        if traits.is_float:
            import numpy as np  # (only where a float reduction is folded: not on a warm start)

            fmt, ifmt = ("<f", "<I") if bits == 32 else ("<d", "<Q")
            cast = np.float32 if bits == 32 else np.float64
            x, y = (cast(struct.unpack(fmt, struct.pack(ifmt, v))[0]) for v in (a, b))
            with np.errstate(all="ignore"):  # overflow to infinity, inf - inf: IEEE results, no warning
                result = traits.host_op(x, y)
            return struct.unpack(ifmt, struct.pack(fmt, result))[0]
        if traits.compare:
            key = (lambda v: v - (1 << bits) if v >> (bits - 1) else v) if traits.signed else None
            return traits.host_op(a, b, key=key)
        return traits.host_op(a, b) & mask


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


def proven_alignment(width: int) -> int:
    """The alignment a kernel's proven access of ``width`` bytes needs on a target of strict
    alignment (a GPU): its width, but none for a v128 access, which a kernel does as aligned
    32-bit pieces whatever its address (``compiler.lower.simd.proven_load``, ``proven_store``),
    so that a vectorised loop over bytes (a blur's ``in[x - 1]``, ``in[x + 1]``) and the
    neighbour loads of a vectorised stencil (``a[i-1]``, 4 bytes off a 16-byte line) launch;
    the guards check the same number."""
    return 1 if width == 16 else width


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
    op: ReductionKind
    update: Value  # its value on the back edge
    local: int | None = None
    init: Poly | None = None  # its value on entry (a constant or a live-in)
    # A v128 accumulator: the SIMD operation combining it ("i32x4.add"). In a plan's list,
    # one lane of it: ``lane`` of the header argument ``vector`` (see
    # ``compiler.analysis.reductions.lane_reductions``).
    lanes: str = ""
    lane: int = 0
    vector: Value | None = None


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
class Phase:
    """One statement group of a distributed loop body (:mod:`.schedule`): a child loop of
    the launched loop, whose ``grid`` loop (the child itself, or its only child after an
    interchange) spreads its iterations over the threads of the row; the loops between run
    whole and in order inside each thread."""

    loop: LoopInfo  # the child loop of the launched loop
    grid: LoopInfo  # the loop whose iterations the row's threads share
    counter: Symbol  # the grid loop's counter
    trip: TripCount  # the grid loop's trip count (it moves with the launched loop's counter at most)
    blocks: set[Block] = field(default_factory=set)  # ``loop``'s body
    grid_blocks: set[Block] = field(default_factory=set)  # ``grid``'s body
    exit: Block | None = None  # where control goes after ``loop`` (a phase that skips it jumps there)
    grid_exit: Block | None = None  # where control goes after ``grid``
    # ``loop`` stores outside ``grid`` (clang's remainder of an unrolled ``grid``): one more
    # thread, past the grid's iterations, runs ``loop`` with those stores and without ``grid``.
    rest: bool = False
    # The launched loop's statements outside its child loops (correlation's ``corr[i][i] = 1``
    # before its ``j`` loop): one thread runs the body with every child loop skipped.
    # ``loop`` and ``grid`` are then the launched loop, ``blocks`` the blocks of those statements.
    statements: bool = False
    # A phase of a split sequential loop (:mod:`.fission`): the stores it makes, as indices in
    # the plan's accesses (it leaves the others out); whether each thread runs it whole for
    # iterations of the loop of its own (else: for its grid iteration, in every iteration of
    # the loop in order); and the child loops it skips, header -> the block after the loop.
    stores: frozenset[int] = frozenset()
    whole: bool = False
    skip: dict[Block, Block] = field(default_factory=dict)
    # A stepped loop's grid phase over part of its grid loop (:meth:`.fission._Parts.pivot`):
    # the iterations ``t`` below (``side`` -1), at (0) or above (1) ``floor((a * k + c) / d)``,
    # ``pivot`` ``(a, c, d)`` and ``k`` the loop's iteration.
    pivot: tuple[int, int, int] | None = None
    side: int = 0
    # Such a phase run as a grid of cells (:meth:`.fission._Parts._cells`): a task an iteration
    # ``u`` of the grid loop's one inner loop ``inner`` (rows over the grid's blocks, a row's
    # cells over a block's threads), those below, at or above ``inner_pivot`` (all: None).
    inner: Collapse | None = None
    inner_pivot: tuple[int, int, int] | None = None
    inner_side: int = 0


@record
class Privatised:
    """A temporary every iteration writes before it reads it (:mod:`.privatise`): in the
    kernel each thread works on a copy of its own, ``count`` elements of ``type`` from the
    address ``base``, except the thread of the last iteration, which works on memory
    itself, so that memory ends as the loop leaves it."""

    accesses: tuple[int, ...]  # indices in the plan's accesses: the temporary's loads and stores
    base: Poly  # the address of the copy's element 0 (live-ins and a constant)
    type: Type  # i32 or i64: every access reads or writes one element whole (a float as its bits)
    count: int  # elements


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
    # A distributed body (:mod:`.schedule`): the launched loop's children, one launch phase
    # each, run by the threads of one block per iteration with a barrier between phases;
    # empty for a body run whole by one thread.
    phases: tuple[Phase, ...] = ()
    # Its phases split a sequential loop (:mod:`.fission`): each runs over every iteration
    # of the loop before the next begins, the whole grid waiting between them.
    fission: bool = False
    # Its iterations run in order, each running the phases in turn (``fission`` too): a phase
    # over a child loop on the grid, a phase ``whole`` on one thread, the grid waiting between
    # them (:func:`.fission.split_stepped`).
    stepped: bool = False
    # A stepped loop's ``work`` that its phases on one thread run (the rest runs over grids).
    serial_work: list[tuple[int, tuple[Symbol, ...]]] = field(default_factory=list)
    # A stepped loop run as a wavefront (:func:`.fission.split_wavefront`): per phase, ``(m,
    # c)`` of its step ``w = m * k + t + c`` (``k`` the loop's counter, ``t`` the phase's grid
    # counter); empty for one whose iterations run in order. Each phase's ``work`` for one of
    # its grid iterations (a task) alongside.
    wave: tuple[tuple[int, int], ...] = ()
    task_work: tuple[tuple[tuple[int, tuple[Symbol, ...]], ...], ...] = ()
    # (store, access) index pairs of a stepped loop's grid phase that never meet within one
    # of its tasks (a grid iteration at one iteration of the loop), isl's proof: the kernel
    # tells LLVM so (scoped no-alias metadata), which keeps a sum clang stores in every
    # step of an inner loop in a register (``lu``'s ``A[i][j]``).
    task_apart: frozenset[tuple[int, int]] = frozenset()
    # Store/access index pairs the schedule could not settle statically: within one iteration
    # of the launched loop their byte ranges must be apart (a guard).
    row_guarded: list[tuple[int, int]] = field(default_factory=list)
    # Merges after an inner loop of a distributed body (the unrolled loop's end, where its
    # remainder starts), as polynomials of the launched loop's counter and the live-ins: a
    # phase that skips the loop, or leaves it after one iteration, computes them so.
    pinned: tuple[tuple[Value, Poly], ...] = ()
    # v128 induction variables of the launched loop: header argument -> (start, step, the
    # lane-wise add, "i32x4.add"); the kernel computes start + k * step per lane.
    vector_ivs: dict[Value, tuple[Value, Value, str]] = field(default_factory=dict)
    # Header arguments that carry a load to the next iteration (a rotation), as (argument
    # index, index in ``accesses`` of the reload at the previous iteration's address): the
    # kernel reloads them (:func:`compiler.analysis.accesses.rotated_load`).
    rotations: tuple[tuple[int, int], ...] = ()
    # A wavefront's task loops' header arguments that carry a load to the next task, as
    # (argument, index in ``accesses`` of its reload at the previous task's address): each
    # task reloads them (:func:`.fission.split_wavefront`).
    task_reloads: tuple[tuple[Value, int], ...] = ()
    # Privatised temporaries (doitgen's ``sum``): their accesses go to a copy per thread,
    # and the pairs among them are left out of the guards' comparisons.
    private: tuple[Privatised, ...] = ()

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
    # Split a loop's imperfect nest into phases (compiler.analysis.schedule): for a GPU,
    # whose block shares an iteration's work; the host's threads run whole iterations, each
    # body in Wasm order (its rows streamed, where a phase's thread walks columns).
    distribute: bool = True
    # Split a sequential loop into phases that each run in parallel over all of it
    # (compiler.analysis.fission): for a GPU's grid and the host's threads alike.
    split: bool = True
    # Run a sequential loop whose body mixes parallel child loops with serial work as one
    # launch, its iterations in order (compiler.analysis.fission.split_stepped): for a GPU
    # (the host's threads would run it on one).
    stepped: bool = True
