"""The values of a loop nest as polynomials, and the classes of its loop-carried values.

One :class:`LoopValues` serves the analysis of one candidate loop. It evaluates SSA values
symbolically (:meth:`LoopValues.expr`): a constant is a number, a value defined before the
loop is a symbol (a live-in), ``global.get`` is a symbol per global, and ``add``, ``sub``,
``mul`` and ``shl`` by a constant combine polynomials; anything else is unknown. Each loop
of the nest has a counter symbol ``k<depth>``, its iteration number.

Each header argument of each loop in the nest (the locals a Wasm ``loop`` carries around)
falls in one class, in nest order, outer loops first:

- dead: never read in the loop (clang reuses locals, so a carried local may mean nothing;
  the translator already gives a loop header arguments only for locals live there);
- invariant: every back edge passes it through unchanged, so it is its entry value;
- induction variable: every back edge adds the same loop-invariant step to it, along
  chains of ``add``/``sub`` and through merges whose paths all add the same amount (which
  covers clang's strength-reduced pointers and unrolled copies); its value is then
  ``start + step * k``; any loop-invariant start is a symbol, and an inner loop's start
  that is no polynomial leaves that variable unknown rather than rejecting the loop;
- reduction (the candidate loop's own arguments only): recognised by
  :mod:`compiler.analysis.reductions`;
- v128 induction variable (the candidate loop's own arguments only): a vector every back
  edge adds a loop-invariant vector to, lane by lane with wrapping (``i32x4.add`` and the
  other integer shapes), from a loop-invariant start: clang's ``<i, i+1, i+2, i+3>``
  incremented by a splat (:func:`vector_induction`); its value at iteration ``k`` is
  ``start + k * step`` per lane, modulo the lane width;
- anything else rejects the candidate loop, unless it belongs to an inner loop, which runs
  sequentially inside one thread.
"""

from __future__ import annotations

from functools import cached_property

from tensorwasm.compiler.analysis.accesses import rotated_load, task_rotation
from tensorwasm.compiler.analysis.forest import FunctionLoops, Reject
from tensorwasm.compiler.analysis.merges import select_value, selected_merge
from tensorwasm.compiler.analysis.plan import AnalysisOptions, Reduction
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.analysis.reductions import init_bits, recognise_reduction
from tensorwasm.compiler.analysis.trips import exit_merge
from tensorwasm.dialect import arith, simd
from tensorwasm.dialect.ir import Block, LoopInfo, Op, Value
from tensorwasm.dialect.types import V128


def kernel_computes(poly: Poly) -> bool:
    """Every floor symbol of ``poly`` stands alone in its term with a multiple of its divisor
    as coefficient: ``c * floor(x / d)`` is then ``(c / d) * (x & -d)``, which a kernel
    computes exactly modulo 2^32 however ``x`` wraps (a distributed loop's grid bounds,
    :mod:`compiler.distribute`; a loop's own starts and steps come from before it, symbols)."""
    for monomial, coeff in poly.terms.items():
        floors = [s for s in monomial if s.kind == "floor"]
        if floors and (
            len(monomial) > 1 or coeff % floors[0].ref[1] or not kernel_computes(floors[0].ref[0])
        ):
            return False
    return True


class LoopValues:
    """Symbolic values and header-argument classes of one candidate loop and its inner loops."""

    def __init__(self, facts: FunctionLoops, info: LoopInfo, options: AnalysisOptions, lenient: bool = False):
        self.facts = facts
        self.info = info
        self.options = options
        self.body = facts.bodies[info]
        self.counters: dict[LoopInfo, Symbol] = {}
        self.symbols: dict[Value, Symbol] = {}
        self.globals: dict[int, Symbol] = {}
        self.memo: dict[Value, Poly | None] = {}
        self.ivs: dict[Value, tuple[Poly, Poly]] = {}  # header arg -> (start, step)
        self.invariant_args: dict[Value, Value] = {}
        self.dead_args: set[Value] = set()
        self.lenient = lenient  # classify what can be classified, reject nothing
        self.opaque = False  # an unknown value is a symbol of its own (:attr:`unbounded`)
        self.reductions: dict[Value, Reduction] = {}
        self.vector_ivs: dict[Value, tuple[Value, Value, str]] = {}  # v128 arg -> (start, step, add op)
        self.floor_symbols: dict[tuple[Poly, int], Symbol] = {}
        self.rotations: dict[Value, tuple[Op, Poly]] = {}  # header arg -> (its load, that load's address)
        # A child loop's header arg that carries a load to its next iteration -> (the child
        # loop, its load, that load's address): a wavefront's task reloads it.
        self.task_rotations: dict[Value, tuple[LoopInfo, Op, Poly]] = {}
        self.rotating: list[tuple[LoopInfo, Value, Value, Value]] = []  # (their candidates)

    # Both made at first use: a loop rejected by its own header arguments (every loop around
    # the innermost of a deep nest, say) needs neither, and each costs the size of the body.
    @cached_property
    def body_order(self) -> list[Block]:
        """The body's blocks in function order: everything derived from the body (live-in
        order, access indices) must not depend on set iteration, which differs between
        processes."""
        return self.facts.in_order(self.body)

    @cached_property
    def nested(self) -> list[LoopInfo]:
        """The loops inside this one, itself included, in the function's loop order."""
        return self.facts.nested(self.info)

    @cached_property
    def unbounded(self) -> LoopValues:
        """The function's values with no live-ins of this loop: :mod:`.merges` proves its
        equalities on a live-in as the code before the loop computed it."""
        wide = LoopValues(self.facts, self.info, self.options, lenient=True)
        wide.body = set(self.facts.func.blocks)
        wide.opaque = True
        return wide

    def work(self, blocks) -> list[tuple[int, tuple[Symbol, ...]]]:
        """The ops of ``blocks`` (blocks of the loop), grouped by the counters of the inner
        loops that repeat them: the runtime's estimate of the work multiplies each group by
        those loops' trip counts (``LoopPlan.work``)."""
        grouped: dict[tuple[Symbol, ...], int] = {}
        for block in blocks:
            inside = (m for m in self.nested if m is not self.info and block in self.facts.bodies[m])
            around = tuple(self.counter(m) for m in inside)
            grouped[around] = grouped.get(around, 0) + len(block.ops)
        return [(ops, around) for around, ops in grouped.items()]

    def counter(self, loop: LoopInfo) -> Symbol:
        """The symbol of ``loop``'s iteration number, made at its first use."""
        sym = self.counters.get(loop)
        if sym is None:
            sym = self.counters[loop] = Symbol("counter", loop, f"k{loop.depth}")
        return sym

    # -- header arguments ----------------------------------------------------------------------

    def classify_header_args(self, loop: LoopInfo) -> None:
        """Sort ``loop``'s header arguments into the classes above (outer loops first: an
        inner start may be an outer induction variable); :class:`Reject` where one fits none."""
        facts = self.facts
        header = loop.header
        entry = facts.entry_edge_args(loop)
        backs = facts.back_edge_args(loop)
        loop_body = facts.bodies[loop]
        for i, arg in enumerate(header.args):
            incoming = [b[i] for b in backs]
            reads = [u for u, b in facts.users.get(arg, []) if b in loop_body and not
                     (u.block in facts.latches[loop] and u.opdef.terminator and arg in u.operands + [
                      v for sc in u.successors if sc.block is not header for v in sc.args])]  # fmt: skip
            if not any(u for u, b in facts.users.get(arg, []) if b in loop_body) or (
                not reads and all(v is arg for v in incoming)
            ):
                # Never read inside the loop: overwritten before use in every iteration.
                self.dead_args.add(arg)
                continue
            if all(v is arg or v is entry[i] for v in incoming):
                self.invariant_args[arg] = entry[i]
                continue
            steps = [self.step_of(v, arg, loop_body) for v in incoming]
            if all(s is not None for s in steps) and all(s == steps[0] for s in steps):
                start = self.expr(entry[i])
                if start is None and loop is not self.info:
                    # An inner loop's counter from a value of the enclosing iteration that
                    # is no polynomial: the inner loop still runs in the thread, and what
                    # it addresses through this value is unknown (a gather, or a store
                    # the access analysis names).
                    continue
                if start is None:
                    raise Reject(
                        f"induction variable {self.local_name(loop, i)} starts from an unknown value"
                    )
                self.ivs[arg] = (start, steps[0])
                continue
            if loop is self.info and len(incoming) == 1 and rotated_load(self, arg, incoming[0], entry[i]):
                continue
            if loop is self.info and len(incoming) == 1:
                reduction = recognise_reduction(self, arg, incoming[0], loop_body)
                if reduction is not None:
                    reduction.init = self.expr(entry[i]) if not arg.type.is_float else None
                    if reduction.init is None:
                        reduction.init = init_bits(self, entry[i])
                    reduction.local = loop.assigned[i] if i < len(loop.assigned) else None
                    self.reductions[arg] = reduction
                    continue
            if loop is self.info:
                found = vector_induction(self, arg, incoming, entry[i], loop_body)
                if found is not None:
                    self.vector_ivs[arg] = found
                    continue
            if loop.parent is self.info and len(incoming) == 1 and not self.lenient:
                self.rotating.append((loop, arg, incoming[0], entry[i]))  # (for a wavefront's tasks)
            if loop is not self.info or self.lenient:
                continue  # inner loops run sequentially inside one thread: anything goes
            raise Reject(
                f"{self.local_name(loop, i)} is carried from one iteration to the next and is neither "
                f"an induction variable nor a recognised reduction"
            )

    def classify_task_rotations(self) -> None:
        """The child loops' header arguments that carry a value to the next task
        (:func:`.accesses.task_rotation`): once every loop's counters are classified, as
        their addresses use them."""
        for loop, arg, back, first in self.rotating:
            task_rotation(self, loop, arg, back, first)

    def local_name(self, loop: LoopInfo, i: int) -> str:
        """Header argument ``i`` of ``loop`` as the reports name it: the local it enters as."""
        entry = self.facts.entry_edge_args(loop)[i]
        local = next((n for n in loop.assigned if loop.entry_env[n] is entry), None)
        return f"local {local}" if local is not None else f"loop value {i}"

    def step_of(self, value: Value, arg: Value, body: set[Block]) -> Poly | None:
        """The loop-invariant amount by which ``value`` exceeds ``arg`` (chains of add/sub)."""
        total = Poly()
        while value is not arg:
            op = value.owner
            if isinstance(op, Block):
                merged = self._merged_step(value, arg, body)
                return None if merged is None else total + merged
            if not isinstance(op, Op) or op.name not in ("arith.add", "arith.sub"):
                return None
            lhs, rhs = op.operands
            if op.name == "arith.add" and self.invariant_in(lhs, body) and not self.invariant_in(rhs, body):
                lhs, rhs = rhs, lhs
            if not self.invariant_in(rhs, body):
                return None
            amount = self.expr(rhs)
            if amount is None:
                return None
            total = total + (amount if op.name == "arith.add" else -amount)
            value = lhs
        return total

    def _merged_step(self, value: Value, arg: Value, body: set[Block]) -> Poly | None:
        """A merge argument (not a loop header's) whose every incoming value has the same
        step from ``arg``: clang -O2 joins a guarded inner loop's paths this way."""
        block = value.owner
        if block.attrs.get("loop") or block not in body:
            return None
        steps = []
        for pred in self.facts.preds[block]:
            for succ in pred.terminator.successors:
                if succ.block is block:
                    steps.append(self.step_of(succ.args[value.index], arg, body))
        if not steps or any(step is None or step != steps[0] for step in steps):
            return None
        return steps[0]

    def invariant_in(self, value: Value, body: set[Block]) -> bool:
        """``value`` is the same in every iteration of the loop of ``body``."""
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            return True
        return self.facts.def_block[value] not in body

    # -- symbolic values ---------------------------------------------------------------------

    def symbol_for(self, value: Value) -> Symbol:
        """The symbol of a value from before the loop, named for the local holding it."""
        sym = self.symbols.get(value)
        if sym is None:
            local = next((i for i, e in enumerate(self.info.entry_env) if e is value), None)
            label = f"local{local}" if local is not None else f"v{len(self.symbols)}"
            sym = self.symbols[value] = Symbol("value", value, label)
        return sym

    def expr(self, value: Value) -> Poly | None:
        """``value`` as a polynomial in counters and live-ins, or None where it is unknown."""
        if value in self.memo:
            return self.memo[value]
        self.memo[value] = None  # cycles through header arguments resolve to unknown
        result = self._expr(value)
        if result is None and self.opaque:
            result = Poly.symbol(self.symbol_for(value))
        self.memo[value] = result
        return result

    def _expr(self, value: Value) -> Poly | None:
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            ty, bits = owner.attrs["type"], owner.attrs["value"]
            if ty.is_float:
                return None
            return Poly.const(bits - (1 << ty.bits) if bits >> (ty.bits - 1) else bits)
        block = self.facts.def_block[value]
        if block not in self.body:
            return Poly.symbol(self.symbol_for(value))
        if isinstance(owner, Block):
            loop = block.attrs.get("loop")
            if loop is None:  # a merge: known when every incoming value is the same polynomial
                incoming = [
                    self.expr(succ.args[value.index])
                    for pred in self.facts.preds[block]
                    for succ in pred.terminator.successors
                    if succ.block is block
                ]
                if not incoming:  # the function's parameters (read so by :attr:`unbounded`)
                    return Poly.symbol(self.symbol_for(value))
                if incoming and incoming[0] is not None and all(p == incoming[0] for p in incoming):
                    return incoming[0]
                merged = exit_merge(self, value)
                return merged if merged is not None else selected_merge(self, value)
            if value in self.invariant_args:
                return self.expr(self.invariant_args[value])
            if value in self.ivs:
                start, step = self.ivs[value]
                return start + step * Poly.symbol(self.counter(loop))
            return None
        op = owner
        if op.name == "global.get":
            sym = self.globals.get(op.attrs["index"])
            if sym is None:
                sym = self.globals[op.attrs["index"]] = Symbol(
                    "global", op.attrs["index"], f"g{op.attrs['index']}"
                )
            return Poly.symbol(sym)
        if op.name in ("arith.add", "arith.sub", "arith.mul", "arith.shl"):
            a, b = (self.expr(v) for v in op.operands)
            if a is None or b is None:
                return None
            if op.name == "arith.add":
                return a + b
            if op.name == "arith.sub":
                return a - b
            if op.name == "arith.mul":
                return a * b
            if b.is_constant():
                return a.scale(1 << (b.constant & (op.operands[0].type.bits - 1)))
        if op.name == "arith.and":
            return self.masked(op)
        if op.name == "arith.or":
            return self.or_low_bits(op)
        if op.name == "arith.select":
            return select_value(self, op)
        return None

    # -- quasi-affine values (clang's unrolled loops) ---------------------------------------

    def floor_of(self, inner: Poly, divisor: int) -> Poly:
        """``floor(inner / divisor)`` as a polynomial: a number, or one floor symbol per
        value (interned, so equal values compare equal)."""
        if inner.is_constant():
            return Poly.const(inner.constant // divisor)
        key = (inner, divisor)
        sym = self.floor_symbols.get(key)
        if sym is None:
            sym = self.floor_symbols[key] = Symbol.floor(inner, divisor)
        return Poly.symbol(sym)

    def masked(self, op: Op) -> Poly | None:
        """``x & -2^k`` as ``2^k * floor(x / 2^k)`` and ``x & (2^k - 1)`` as
        ``x - 2^k * floor(x / 2^k)``: exact modulo 2^bits (see :mod:`.poly`); other masks
        are unknown."""
        a, b = (self.expr(v) for v in op.operands)
        if b is not None and not b.is_constant():
            a, b = b, a
        if a is None or b is None or not b.is_constant():
            return None
        mask = b.constant
        if mask == -1:
            return a
        if mask == 0:
            return Poly.const(0)
        if mask < 0 and (-mask) & (-mask - 1) == 0:
            return self.floor_of(a, -mask).scale(-mask)
        if mask > 0 and mask & (mask + 1) == 0:
            return a - self.floor_of(a, mask + 1).scale(mask + 1)
        return None

    def or_low_bits(self, op: Op) -> Poly | None:
        """``x | c`` for a number ``0 <= c < 2^k`` and an ``x`` whose every coefficient is a
        multiple of ``2^k`` (its low ``k`` bits are zero modulo 2^bits): ``x + c``, as clang
        writes ``(n & -4) | 1``; other ors are unknown."""
        a, b = (self.expr(v) for v in op.operands)
        if b is not None and not b.is_constant():
            a, b = b, a
        if a is None or b is None or not b.is_constant() or b.constant < 0:
            return None
        low = 1 << b.constant.bit_length()
        if any(c % low for c in a.terms.values()):
            return None
        return a + b


# The lane-wise adds that make a v128 induction variable: they wrap per lane, so the value
# at iteration k is start + k * step in each lane, modulo the lane width.
VECTOR_IV_ADDS = ("i8x16.add", "i16x8.add", "i32x4.add", "i64x2.add")


def vector_induction(
    values: LoopValues, arg: Value, incoming: list[Value], start: Value, body: set[Block]
) -> tuple[Value, Value, str] | None:
    """``(start, step, add)`` where the v128 header argument ``arg`` is an induction vector:
    every back edge passes ``add(arg, step)`` (either operand order) for one loop-invariant
    ``step`` and one integer lane shape; None otherwise. The start is the entry value, which
    is loop-invariant by construction (it flows in on the entry edge)."""
    if arg.type is not V128 or not incoming:
        return None
    found = None
    for value in incoming:
        op = value.owner
        if not (isinstance(op, Op) and op.opdef is simd.binary and op.attrs.get("op") in VECTOR_IV_ADDS):
            return None
        lhs, rhs = op.operands
        if rhs is arg:
            lhs, rhs = rhs, lhs
        if lhs is not arg or rhs is arg or not values.invariant_in(rhs, body):
            return None
        if found is not None and found != (rhs, op.attrs["op"]):
            return None
        found = (rhs, op.attrs["op"])
    return start, found[0], found[1]
