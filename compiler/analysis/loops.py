"""Loop analysis: which loops of a function can run one iteration per GPU thread.

For every Wasm ``loop`` (its header block is marked by the translator) this finds the
natural loop, its induction variables (any header argument that grows by a loop-invariant
step, which covers clang's strength-reduced pointers and unrolled copies), recognised
reductions, the trip count as an expression of values known at loop entry, and every
memory access as a polynomial in the loops' iteration counters and the live-in values.

The verdict is "offload" when the loop is legal given runtime guards, with the guards
described as data in :class:`LoopPlan` (:mod:`compiler.analysis.plan`): accesses whose
independence cannot be settled statically are checked by the runtime on concrete values
before each launch. A rejected loop carries the precise reason. Profitability is the
runtime's business, not this one's.
"""

from __future__ import annotations

from fractions import Fraction

from tensorwasm.compiler.analysis.plan import (
    Access,
    AnalysisOptions,
    Collapse,
    LiveOut,
    LoopPlan,
    LoopReport,
    Reduction,
    TripCount,
)
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.callgraph import reachable
from tensorwasm.compiler.errors import NotCompilable
from tensorwasm.dialect import arith
from tensorwasm.dialect.ir import Block, Function, LoopInfo, Module, Op, Value
from tensorwasm.dialect.verifier import dominators, reverse_postorder

NEGATE = {"eq": "ne", "ne": "eq", "slt": "sge", "sge": "slt", "sgt": "sle", "sle": "sgt",
          "ult": "uge", "uge": "ult", "ugt": "ule", "ule": "ugt"}  # fmt: skip
SWAP = {"eq": "eq", "ne": "ne", "slt": "sgt", "sgt": "slt", "sle": "sge", "sge": "sle",
        "ult": "ugt", "ugt": "ult", "ule": "uge", "uge": "ule"}  # fmt: skip
INT_REDUCTIONS = {"arith.add": "add", "arith.mul": "mul", "arith.and": "and", "arith.or": "or",
                  "arith.xor": "xor"}  # fmt: skip
FLOAT_REDUCTIONS = {"arith.fadd": "fadd", "arith.fmul": "fmul"}
MEMORY_EFFECTS = {"mem.store", "mem.grow", "mem.copy", "mem.fill", "mem.init", "mem.data_drop"}
STATE_WRITES = {"global.set", "table.set", "table.grow", "table.fill", "table.copy", "table.init",
                "table.elem_drop"}  # fmt: skip


class Reject(Exception):
    """Why a loop cannot be offloaded (message: the reason shown in the report)."""


class FunctionLoops:
    """Loop structure and def-use facts of one function, shared by its loops' analyses."""

    def __init__(self, module: Module, func: Function):
        self.module = module
        self.func = func
        order = reverse_postorder(func)
        self.idom = dominators(order)
        self.preds: dict[Block, list[Block]] = {b: [] for b in func.blocks}
        for b in func.blocks:
            for s in b.successors:
                self.preds[s].append(b)
        self.def_block: dict[Value, Block] = {}
        self.users: dict[Value, list[tuple[Op, Block]]] = {}
        for block in func.blocks:
            for arg in block.args:
                self.def_block[arg] = block
            for op in block.ops:
                for r in op.results:
                    self.def_block[r] = block
                for v in op.operands:
                    self.users.setdefault(v, []).append((op, block))
                for succ in op.successors:
                    for v in succ.args:
                        self.users.setdefault(v, []).append((op, block))
        self.bodies: dict[LoopInfo, set[Block]] = {info: self._body(info) for info in func.loops}
        self.latches: dict[LoopInfo, list[Block]] = {
            info: [p for p in self.preds[info.header] if p in self.bodies[info]] for info in func.loops
        }

    def dominates(self, a: Block, b: Block) -> bool:
        while True:
            if a is b:
                return True
            parent = self.idom.get(b)
            if parent is None or parent is b:
                return False
            b = parent

    def _body(self, info: LoopInfo) -> set[Block]:
        header = info.header
        latches = [p for p in self.preds[header] if self.dominates(header, p)]
        body = {header}
        work = list(latches)
        while work:
            b = work.pop()
            if b in body:
                continue
            body.add(b)
            work.extend(self.preds[b])
        return body

    def entry_edge_args(self, info: LoopInfo) -> list[Value]:
        for pred in self.preds[info.header]:
            if pred not in self.bodies[info]:
                for succ in pred.terminator.successors:
                    if succ.block is info.header:
                        return succ.args
        raise Reject("loop header has no entry edge")

    def back_edge_args(self, info: LoopInfo) -> list[list[Value]]:
        out = []
        for latch in self.latches[info]:
            for succ in latch.terminator.successors:
                if succ.block is info.header:
                    out.append(succ.args)
        return out


def analyze_module(module: Module, options: AnalysisOptions | None = None) -> list[LoopReport]:
    reports = []
    for func in module.functions:
        if func.is_import or not func.loops:
            continue
        facts = FunctionLoops(module, func)
        mine = [analyze_loop(facts, info, options or AnalysisOptions()) for info in func.loops]
        _collapse_nests(facts, mine)
        reports.extend(mine)
    return reports


def _collapse_nests(facts: FunctionLoops, reports: list[LoopReport]) -> None:
    """Give a parallel loop more grid dimensions when its body is one parallel loop.

    The outer loop must have no reductions and exactly one child loop, itself accepted
    with no reductions; outside that child the outer body must store nothing (every thread
    of a row runs it), and the code after the child must not be able to trap (a collapsed
    thread skips it). The inner trip count is already known not to vary per iteration.
    When the child collapses its own child the same way, the nest becomes a 3-D grid,
    provided the grandchild's loop-carried values are still induction variables or
    invariants of the outer loop.
    """
    by_loop = {r.loop: r for r in reports}
    for report in sorted(reports, key=lambda r: -r.loop.depth):  # children first
        plan = report.plan
        if plan is None or plan.reductions:
            continue
        children = [m for m in facts.func.loops if m.parent is plan.loop]
        if len(children) != 1:
            continue
        (child,) = children
        inner = by_loop[child]
        if inner.plan is None or inner.plan.reductions:
            continue
        outside = [b for b in plan.blocks if b not in facts.bodies[child]]
        if any(op.name == "mem.store" for b in outside for op in b.ops):
            continue
        if not all(_cannot_trap(op) for b in _after(facts, child, plan) for op in b.ops):
            continue
        levels = []
        for loop in (child, *(c.loop for c in inner.plan.collapse[:1])):
            body = facts.bodies[loop]
            if not all(a in plan.ivs or a in plan.invariant_args or not _read_in(facts, a, body)
                       for a in loop.header.args):  # fmt: skip
                break
            counter = next((c for c, _ in plan.inner_trips if c.ref is loop), None)
            if counter is None:
                break
            trip = next(t for c, t in plan.inner_trips if c is counter)
            levels.append(Collapse(loop, counter, trip, body))
        if levels:
            plan.collapse = tuple(levels)
            where = " and ".join(f"+0x{c.loop.offset:x}" for c in levels)
            report.reason += (
                f"; {len(levels) + 1}-D grid with the loop{'s' if len(levels) > 1 else ''} at {where}"
            )


def _through_boolean_tests(cmp: Op) -> tuple[Op, bool]:
    """The compare a chain of ``x == 0`` / ``x != 0`` tests of a compare's result decides
    (clang -O2 keeps a loop's exit compare in a local and branches on its ``eqz``), and
    whether the chain negates it."""
    negated = False
    while cmp.attrs["pred"] in ("eq", "ne"):
        a, b = cmp.operands
        zero = next((v for v in (a, b) if _is_zero(v)), None)
        tested = b if zero is a else a
        if isinstance(tested.owner, Op) and tested.owner.name == "arith.zext":
            tested = tested.owner.operands[0]  # the i1 compare widened to i32
        if zero is None or not (isinstance(tested.owner, Op) and tested.owner.name == "arith.cmpi"):
            break
        negated ^= cmp.attrs["pred"] == "eq"
        cmp = tested.owner
    return cmp, negated


def widened_in(v: Value, values: list) -> int | None:
    """The index in ``values`` of ``zext(v)``, for a compare ``v`` (clang keeps a hoisted
    loop test in a local as an i32 and branches on it; the translator branches on the i1)."""
    if not (isinstance(v.owner, Op) and v.owner.name == "arith.cmpi"):
        return None
    return next(
        (i for i, e in enumerate(values)
         if isinstance(e.owner, Op) and e.owner.name == "arith.zext" and e.owner.operands[0] is v),
        None,
    )  # fmt: skip


def _is_zero(v: Value) -> bool:
    owner = v.owner
    return isinstance(owner, Op) and owner.opdef is arith.constant and owner.attrs["value"] == 0


def _cannot_trap(op: Op) -> bool:
    return op.opdef.pure or (op.opdef.terminator and op.name != "cf.trap")


def _read_in(facts: FunctionLoops, arg: Value, body: set[Block]) -> bool:
    return any(b in body for _, b in facts.users.get(arg, []))


def _after(facts: FunctionLoops, child: LoopInfo, plan: LoopPlan) -> set[Block]:
    """The outer body's blocks reachable from the child loop's exits (not via the header)."""
    inner = facts.bodies[child]
    seen: set[Block] = set()
    work = [s for b in inner for s in b.successors if s not in inner]
    while work:
        b = work.pop()
        if b in seen or b is plan.loop.header or b not in plan.blocks:
            continue
        seen.add(b)
        work.extend(b.successors)
    return seen


def analyze_loop(facts: FunctionLoops, info: LoopInfo, options: AnalysisOptions) -> LoopReport:
    try:
        plan = LoopAnalysis(facts, info, options).run()
    except Reject as exc:
        return LoopReport(facts.func, info, "reject", str(exc), _trip_if_known(facts, info))
    guarded = "guards: " + ", ".join(_guard_summary(plan))
    return LoopReport(facts.func, info, "offload", guarded, plan.trip, plan)


def _trip_if_known(facts: FunctionLoops, info: LoopInfo) -> TripCount | None:
    """The trip count of a rejected loop, for the report, when its counter is clear anyway."""
    analysis = LoopAnalysis(facts, info, AnalysisOptions(relaxed_float=True))
    analysis.lenient = True
    try:
        for loop in sorted(analysis.nested, key=lambda m: m.depth):
            analysis.classify_header_args(loop)
        return analysis.trip_count(info)
    except Reject:
        return None


def _guard_summary(plan: LoopPlan) -> list[str]:
    parts = ["trip count", "accesses in bounds"]
    stores = sum(1 for a in plan.accesses if a.store)
    if stores:
        parts.append(f"{stores} store(s) disjoint from other accesses")
    if plan.gathers and stores:
        parts.append(f"{len(plan.gathers)} gathered load(s) checked in the kernel")
    if plan.reductions:
        parts.append("reductions: " + ", ".join(r.op for r in plan.reductions))
    return parts


class LoopAnalysis:
    def __init__(self, facts: FunctionLoops, info: LoopInfo, options: AnalysisOptions):
        self.facts = facts
        self.info = info
        self.options = options
        self.body = facts.bodies[info]
        # Blocks in function order: everything derived from the body (live-in order, access
        # indices) must not depend on set iteration, which differs between processes.
        self.body_order = [b for b in facts.func.blocks if b in self.body]
        self.counters: dict[LoopInfo, Symbol] = {}
        self.symbols: dict[Value, Symbol] = {}
        self.globals: dict[int, Symbol] = {}
        self.memo: dict[Value, Poly | None] = {}
        self.ivs: dict[Value, tuple[Poly, Poly]] = {}  # header arg -> (start, step)
        self.invariant_args: dict[Value, Value] = {}
        self.dead_args: set[Value] = set()
        self.lenient = False  # classify what can be classified, reject nothing
        self.reductions: dict[Value, Reduction] = {}
        self.nested = [m for m in facts.func.loops if facts.bodies[m] <= self.body]

    def counter(self, loop: LoopInfo) -> Symbol:
        sym = self.counters.get(loop)
        if sym is None:
            sym = self.counters[loop] = Symbol("counter", loop, f"k{loop.depth}")
        return sym

    def at(self, op: Op) -> str:
        return f"+0x{op.offset:x}" if op.offset is not None else "?"

    # -- the steps ---------------------------------------------------------------------------

    def run(self) -> LoopPlan:
        info = self.info
        if info.returns:
            raise Reject("returns from inside the loop")
        if len(info.exits) != 1:
            raise Reject(f"has {len(info.exits)} ways out (an early exit)" if info.exits else "never exits")
        self.check_effects()
        for loop in sorted(self.nested, key=lambda m: m.depth):
            self.classify_header_args(loop)
        trip = self.trip_count(info)
        inner = []
        for loop in self.nested:
            if loop is info:
                continue
            inner_trip = self.trip_count(loop)
            # Its count must be the same on every iteration of every enclosing loop: the
            # guards compute it once (a triangular nest, l < j, runs on the CPU).
            nest_counters = {self.counter(m) for m in self.nested}
            if ((inner_trip.bound - inner_trip.start).symbols() & nest_counters) or (
                inner_trip.pred not in ("ne", "eq")
                and (inner_trip.start.symbols() | inner_trip.bound.symbols()) & nest_counters
            ):
                raise Reject(
                    f"inner loop at +0x{loop.offset:x} runs a different number of times per iteration"
                )
            inner.append((self.counter(loop), inner_trip))
        accesses = self.accesses()
        static_free = self.static_dependences(accesses)
        live_ins = self.live_ins()
        live_outs = self.live_outs(trip)
        work: dict[tuple[Symbol, ...], int] = {}
        for block in self.body_order:
            around = tuple(
                self.counter(m) for m in self.nested if m is not info and block in self.facts.bodies[m]
            )
            work[around] = work.get(around, 0) + len(block.ops)
        return LoopPlan(
            self.facts.func, info, self.counter(info), trip, inner, accesses,
            list(self.reductions.values()), live_ins, live_outs, self.body,
            self.ivs, self.invariant_args, static_free, work=[(ops, around) for around, ops in work.items()],
        )  # fmt: skip

    def check_effects(self) -> None:
        module = self.facts.module
        for block in self.body_order:
            for op in block.ops:
                name = op.name
                if name == "func.call_indirect":
                    raise Reject(f"makes an indirect call at {self.at(op)}")
                if name == "func.call":
                    self.check_callee(op)
                elif name in MEMORY_EFFECTS - {"mem.store"}:
                    raise Reject(
                        f"{name.replace('mem.', 'memory.')} at {self.at(op)} changes memory in bulk or its size"
                    )
                elif name in STATE_WRITES:
                    raise Reject(f"{name} at {self.at(op)} writes module state")
                elif name == "cf.return":
                    raise Reject(f"returns from inside the loop at {self.at(op)}")
        del module

    def check_callee(self, op: Op) -> None:
        module = self.facts.module
        callee = op.attrs["callee"]
        try:
            closure = reachable(module, [callee])
        except NotCompilable as exc:
            mod, name = exc.import_name or ("?", "?")
            raise Reject(f"calls import {mod}.{name}") from None
        for index in closure:
            for inner in module.functions[index].ops():
                if inner.name.startswith(("mem.", "global.", "table.")) or inner.name == "func.call_indirect":
                    raise Reject(f"calls {module.functions[callee].name}, which uses memory or module state")

    # -- induction variables and reductions ---------------------------------------------------

    def classify_header_args(self, loop: LoopInfo) -> None:
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
                if start is None:
                    raise Reject(
                        f"induction variable {self.local_name(loop, i)} starts from an unknown value"
                    )
                self.ivs[arg] = (start, steps[0])
                continue
            if loop is self.info and len(incoming) == 1:
                reduction = self.reduction_of(arg, incoming[0], loop_body)
                if reduction is not None:
                    reduction.init = self.expr(entry[i]) if not arg.type.is_float else None
                    if reduction.init is None:
                        reduction.init = self._init_bits(entry[i])
                    reduction.local = loop.assigned[i] if i < len(loop.assigned) else None
                    self.reductions[arg] = reduction
                    continue
            if loop is not self.info or self.lenient:
                continue  # inner loops run sequentially inside one thread: anything goes
            raise Reject(
                f"{self.local_name(loop, i)} is carried from one iteration to the next and is neither "
                f"an induction variable nor a recognised reduction"
            )

    def _init_bits(self, value: Value) -> Poly:
        """A float reduction's entry value, as its bits: a constant, or a live-in symbol."""
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            return Poly.const(owner.attrs["value"])
        return Poly.symbol(self.symbol_for(value))

    def local_name(self, loop: LoopInfo, i: int) -> str:
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
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            return True
        return self.facts.def_block[value] not in body

    def reduction_of(self, arg: Value, update: Value, body: set[Block]) -> Reduction | None:
        op = update.owner
        if not isinstance(op, Op):
            return None
        uses = [u for u, b in self.facts.users.get(arg, []) if b in body]
        if op.name in INT_REDUCTIONS or op.name in FLOAT_REDUCTIONS:
            # A chain of the same associative op from the argument to the update (unrolled
            # loops add twice per iteration), each link used once.
            link = op
            while arg not in link.operands:
                inner = [v for v in link.operands if isinstance(v.owner, Op) and v.owner.name == op.name
                         and self.facts.def_block[v] in body and len(self.facts.users.get(v, [])) == 1]  # fmt: skip
                if len(inner) != 1:
                    return None
                link = inner[0].owner
            if len(uses) != 1 or not self._only_carried(update, body):
                return None
            kind = INT_REDUCTIONS.get(op.name) or FLOAT_REDUCTIONS[op.name]
            if kind in ("fadd", "fmul") and not self.options.relaxed_float:
                raise Reject(f"float reduction ({op.name} at {self.at(op)}) needs --relaxed-float")
            return Reduction(arg, kind, update)
        if op.name == "arith.select":
            # min/max: select(cmp(prev, x), prev, x) links, unrolled loops chain several.
            kinds = set()
            value = update
            while value is not arg:
                link = self._minmax_link(value, arg, body)
                if link is None:
                    return None
                kind, value = link
                kinds.add(kind)
            if len(kinds) != 1 or len(uses) != 2 or not self._only_carried(update, body):
                return None
            return Reduction(arg, kinds.pop(), update)
        return None

    def _only_carried(self, update: Value, body: set[Block]) -> bool:
        """The running value is not read inside the loop except to carry it on: a prefix sum
        stores it, which makes every iteration depend on the one before."""
        inside = [op for op, b in self.facts.users.get(update, []) if b in body]
        return all(op.opdef.terminator and update not in op.operands for op in inside)

    def _minmax_link(self, value: Value, arg: Value, body: set[Block]) -> tuple[str, Value] | None:
        op = value.owner
        if not isinstance(op, Op) or op.name != "arith.select":
            return None
        cond, a, b = op.operands
        cmp = cond.owner
        if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi") or {id(v) for v in cmp.operands} != {
            id(a),
            id(b),
        }:
            return None
        for prev in (a, b):
            is_link = prev is arg or (
                isinstance(prev.owner, Op) and prev.owner.name == "arith.select"
                and self.facts.def_block[prev] in body and len(self.facts.users.get(prev, [])) == 2
            )  # fmt: skip
            if not is_link:
                continue
            pred = cmp.attrs["pred"] if cmp.operands[0] is prev else SWAP[cmp.attrs["pred"]]
            if pred in ("eq", "ne"):
                return None
            less = pred in ("slt", "sle", "ult", "ule")
            kind = "min" if less == (a is prev) else "max"
            return f"{kind}_{'s' if pred.startswith('s') else 'u'}", prev
        return None

    # -- symbolic values ---------------------------------------------------------------------

    def symbol_for(self, value: Value) -> Symbol:
        sym = self.symbols.get(value)
        if sym is None:
            local = next((i for i, e in enumerate(self.info.entry_env) if e is value), None)
            label = f"local{local}" if local is not None else f"v{len(self.symbols)}"
            sym = self.symbols[value] = Symbol("value", value, label)
        return sym

    def expr(self, value: Value) -> Poly | None:
        if value in self.memo:
            return self.memo[value]
        self.memo[value] = None  # cycles through header arguments resolve to unknown
        result = self._expr(value)
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
                if incoming and incoming[0] is not None and all(p == incoming[0] for p in incoming):
                    return incoming[0]
                return None
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
        return None

    # -- trip counts ---------------------------------------------------------------------------

    def trip_count(self, loop: LoopInfo) -> TripCount:
        facts = self.facts
        body = facts.bodies[loop]
        exits = []
        for block in body:
            term = block.terminator
            for succ in term.successors:
                if succ.block not in body and not _only_traps(succ.block):
                    exits.append((block, term))
        if len(exits) != 1:
            raise Reject(f"loop at +0x{loop.offset:x} has {len(exits)} exits (an early exit)")
        block, term = exits[0]
        if term.name != "cf.cond_br":
            raise Reject(f"loop at +0x{loop.offset:x} leaves through a {term.name}")
        cond = term.operands[0]
        stays = term.successors[0].block in body
        cmp = cond.owner
        if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
            raise Reject(f"loop at +0x{loop.offset:x} exits on a condition that is not an integer compare")
        cmp, negated = _through_boolean_tests(cmp)
        if negated:
            stays = not stays
        bottom = block in facts.latches[loop] and any(s.block is loop.header for s in term.successors)
        top = not bottom and block is loop.header
        if not top and not bottom:
            raise Reject(f"loop at +0x{loop.offset:x} exits from the middle of its body")
        if top:
            for op in block.ops[:-1]:
                if not op.opdef.pure:
                    hint = (
                        " (its counter lives in memory, as in unoptimised code)"
                        if op.name == "mem.load"
                        else ""
                    )
                    raise Reject(
                        f"loop at +0x{loop.offset:x} runs {op.name} at {self.at(op)} before its exit test{hint}"
                    )
        pred = cmp.attrs["pred"] if stays else NEGATE[cmp.attrs["pred"]]
        x, y = (self.expr(v) for v in cmp.operands)
        k = self.counter(loop)
        if x is None or y is None:
            raise Reject(
                f"loop at +0x{loop.offset:x} has a trip count that depends on memory or unknown values"
            )
        if not x.uses(k):
            x, y, pred = y, x, SWAP[pred]
        split = x.split(k)
        if split is None or y.uses(k) or not split[1].is_constant() or split[1].constant == 0:
            raise Reject(f"loop at +0x{loop.offset:x} has no counted exit test")
        start, step = split
        other_counters = {s for s in start.symbols() | y.symbols() if s.kind == "counter" and s is not k}
        inner = {self.counters.get(m) for m in self.nested if m is not loop and m.depth > loop.depth}
        if other_counters & inner:
            raise Reject(f"loop at +0x{loop.offset:x} has an exit test that depends on an inner loop")
        return TripCount(top, pred, start, step.constant, y, cmp.operands[0].type.bits)

    # -- memory ----------------------------------------------------------------------------------

    def accesses(self) -> list[Access]:
        out = []
        counters = set(self.counters.values())
        for block in self.body_order:
            for op in block.ops:
                if op.name not in ("mem.load", "mem.store"):
                    continue
                address = self.expr(op.operands[0])
                if address is not None:
                    address = address + Poly.const(op.attrs["offset"])
                    for c in address.symbols() & counters:
                        split = address.split(c)
                        if split is None or split[1].symbols() & counters:
                            address = None
                            break
                beyond = frozenset(
                    sym for loop, sym in self.counters.items()
                    if loop is not self.info and address is not None and address.uses(sym)
                    and block not in self.facts.bodies[loop]
                )  # fmt: skip
                out.append(
                    Access(
                        op, op.name == "mem.store", op.attrs["bits"] // 8, address, op.attrs["offset"], beyond
                    )
                )
        for a in out:
            if a.address is None:
                if a.store:
                    raise Reject(
                        f"store at {a.where} writes an address that is not affine in the loop counters"
                    )
                # A gather: its addresses are unknown before the launch, so the kernel checks
                # each one against the ranges the loop writes (see LoopPlan.gathers).
        return out

    def static_dependences(self, accesses: list[Access]) -> list[tuple[int, int]]:
        """Settle pairs whose addresses differ by a constant; raise on a proven conflict.
        Returns the index pairs proven independent (the runtime need not test them)."""
        k = self.counter(self.info)
        counters = set(self.counters.values())
        free = []
        for i, s in enumerate(accesses):
            if not s.store:
                continue
            for j, a in enumerate(accesses):
                if a.address is None or s.address is None:
                    continue
                diff = s.address - a.address
                split = s.address.split(k)
                other = a.address.split(k)
                if split is None or other is None:
                    continue
                c = split[1]
                distance = _multiple_of(diff, c)
                if (
                    distance is not None and distance != 0 and c == other[1]
                    and _same_inner_terms(s.address, a.address, counters - {k})
                ):  # fmt: skip
                    if abs(distance) >= DEPENDENCE_DISTANCE_GUARDED:
                        # Apart by more iterations than a loop too short to launch runs:
                        # the guards settle it at run time from the actual trip count.
                        continue
                    # The access reads (or writes) what the store wrote |distance| iterations
                    # earlier, whatever the values: a loop-carried dependence.
                    raise Reject(
                        f"store at {s.where} may overlap {a.kind} at {a.where} across iterations "
                        f"(distance {abs(distance)})"
                    )
                if not diff.is_constant() or not c.is_constant():
                    continue
                if (s.address.symbols() & counters) - {k}:
                    continue  # inner loops: the runtime compares per-iteration footprints
                if _overlaps_across_iterations(diff.constant, c.constant, s.width, a.width):
                    raise Reject(f"store at {s.where} may overlap {a.kind} at {a.where} across iterations")
                free.append((i, j))
        return free

    # -- values in and out -----------------------------------------------------------------------

    def _live_in(self, v: Value, entry: list, seen: dict) -> None:
        """Record what the kernel needs for ``v``, a value the body reads: nothing for a
        constant or a body value, the local holding it, or (a value no local holds, such
        as a comparison clang hoisted) the same for the operands it is recomputed from."""
        if v in seen or self.facts.def_block.get(v) in self.body:
            return
        owner = v.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            return
        local = next((i for i, e in enumerate(entry) if e is v), None)
        if local is not None:
            seen[v] = (v, self.symbol_for(v), "local", local)
            return
        widened = widened_in(v, entry)
        if widened is not None:  # a compare a local holds as 0 or 1: the kernel tests it
            seen[entry[widened]] = (entry[widened], self.symbol_for(entry[widened]), "local", widened)
            return
        if isinstance(owner, Op) and owner.name.startswith("arith.") and owner.opdef.pure:
            for operand in owner.operands:
                self._live_in(operand, entry, seen)
            return
        raise Reject("uses a value computed before the loop that no local holds")

    def live_ins(self) -> list[tuple[Value, Symbol, str, int]]:
        entry = self.info.entry_env
        seen: dict[Value, tuple[Value, Symbol, str, int]] = {}
        for block in self.body_order:
            for op in block.ops:
                values = list(op.operands) + [v for s in op.successors for v in s.args]
                for v in values:
                    self._live_in(v, entry, seen)
                if op.name == "global.get":
                    index = op.attrs["index"]
                    self.expr(op.results[0])
                    key = op.results[0]
                    seen[key] = (key, self.globals[index], "global", index)
        # IV start values are live-ins too (they flow in on the entry edge).
        for start, _ in self.ivs.values():
            for sym in start.symbols():
                if sym.kind == "value" and sym.ref not in seen:
                    local = next((i for i, e in enumerate(entry) if e is sym.ref), None)
                    if local is None:
                        raise Reject("an induction variable starts from a value no local holds")
                    seen[sym.ref] = (sym.ref, sym, "local", local)
        for sym in self.symbols.values():
            if sym.ref not in seen and sym.kind == "value":
                local = next((i for i, e in enumerate(entry) if e is sym.ref), None)
                if local is None:
                    raise Reject("the trip count depends on a value no local holds")
                seen[sym.ref] = (sym.ref, sym, "local", local)
        # Locals first, then globals: the order of the kernel's parameters and of the
        # values the rewritten module passes to the host.
        return sorted(seen.values(), key=lambda item: item[2] != "local")

    def used_outside(self, value: Value) -> bool:
        for op, block in self.facts.users.get(value, []):
            if block not in self.body:
                return True
            if any(value in s.args and s.block not in self.body for s in op.successors):
                return True
        return False

    def live_outs(self, trip: TripCount) -> list[LiveOut]:
        info = self.info
        _, exit_env = info.exits[0]
        k = self.counter(info)
        outs = []
        by_update = {r.update: r for r in self.reductions.values()}
        exported = set()
        for local in info.assigned:
            value = exit_env[local]
            exported.add(value)
            if not self.used_outside(value):
                outs.append(LiveOut(local, "dead"))
                continue
            reduction = by_update.get(value) or self.reductions.get(value)
            if reduction is not None:
                outs.append(LiveOut(local, "reduction", reduction=reduction))
                continue
            poly = self.expr(value)
            counters = {c for c in self.counters.values() if c is not k}
            if poly is None or poly.symbols() & counters:
                raise Reject(f"local {local}'s value from the last iteration is used after the loop")
            outs.append(LiveOut(local, "affine", value=poly))
        for block in self.body_order:
            for op in block.ops:
                for r in op.results:
                    if r not in exported and self.used_outside(r):
                        raise Reject(f"a value computed in the loop at {self.at(op)} is used after it")
            for arg in block.args:
                if arg not in exported and self.used_outside(arg) and arg not in self.invariant_args:
                    raise Reject("a loop value is used after the loop without a local to carry it")
        return outs


# A dependence this many iterations apart or more is left to the run-time guards (it
# exists only when the loop runs longer than that); a closer one rejects the loop, since a
# loop of fewer iterations would not pay for a launch anyway.
DEPENDENCE_DISTANCE_GUARDED = 16


def _multiple_of(diff: Poly, c: Poly) -> int | None:
    """m such that diff == m * c, if there is an integer one (c not zero)."""
    if not c.terms:
        return None
    if not diff.terms:
        return 0
    monomial, coeff = next(iter(c.terms.items()))
    have = diff.terms.get(monomial, 0)
    if have % coeff:
        return None
    m = have // coeff
    return m if diff == c.scale(m) else None


def _same_inner_terms(a: Poly, b: Poly, counters: set) -> bool:
    """The two addresses move the same way with every inner loop counter."""
    for counter in counters:
        sa, sb = a.split(counter), b.split(counter)
        if sa is None or sb is None or sa[1] != sb[1]:
            return False
    return True


def _only_traps(block: Block) -> bool:
    term = block.terminator
    return term is not None and term.name == "cf.trap"


def _overlaps_across_iterations(d: int, c: int, ws: int, wa: int) -> bool:
    """Is there an integer delta != 0 with -ws < d + c*delta < wa (store at k, access at k - delta)?"""
    if c == 0:
        return -ws < d < wa
    lo, hi = Fraction(-ws - d, c), Fraction(wa - d, c)
    if lo > hi:
        lo, hi = hi, lo
    first = int(lo) + 1 if lo >= 0 or lo == int(lo) else int(lo)
    if first <= lo:
        first += 1
    candidates = range(first, int(hi) + 2)
    return any(lo < delta < hi and delta != 0 for delta in candidates)
