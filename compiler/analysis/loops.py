"""Loop analysis: which loops of a function can run one iteration per GPU thread.

For every Wasm ``loop`` (its header block is marked by the translator) the analysis runs
these steps, each in a module of its own, any of which may reject the loop with its
reason (:class:`Reject`):

1. the loop forest and def-use facts of the function (:mod:`.forest`), once per function;
2. the body's effects: no indirect call, no call reaching memory, module state or an
   import, no bulk memory operation or ``memory.grow``, no write of module state, no
   ``return`` (here); and a nest inside it at most ``forest.MAX_LOOP_DEPTH`` loops deep
   (the steps below cost each loop the size of its nest: a loop heading a deeper one is
   rejected unexamined, which keeps the analysis linear in the function's size);
3. every header argument of the loop and its inner loops classified as dead, invariant,
   induction variable (``start + step * k``) or, for the loop's own, a reduction
   (:mod:`.induction`, :mod:`.reductions`);
4. the trip count of the loop and of each inner loop, the inner ones' bounds affine in
   the enclosing loops' counters (triangular and trapezoidal nests) (:mod:`.trips`);
5. every memory access as a polynomial in the counters and live-ins (:mod:`.accesses`),
   and the dependence tests that settle store/access pairs statically: constant distances
   (:mod:`.dependences`), then exact dependences on the nest's polyhedral model (:mod:`.isl`),
   which also proves loops sequential (a time-step loop: a region around its inner loops;
   a loop whose body splits into phases that each run in parallel, :mod:`.fission`, is
   accepted so split);
6. the live-ins and live-outs (:mod:`.liveness`), and the work per iteration.

The verdict is "offload" when the loop is legal given runtime guards, with the guards
described as data in :class:`LoopPlan` (:mod:`compiler.analysis.plan`): accesses whose
independence cannot be settled statically are checked by the runtime on concrete values
before each launch. A rejected loop carries the precise reason. Finally, perfectly nested
parallel loops are collapsed into 2-D and 3-D grids (:mod:`.nests`), and imperfect nests
distributed and interchanged into phases of a 2-D grid (:mod:`.schedule`). Profitability is the
runtime's business, not this one's.
"""

from __future__ import annotations

import contextlib

from tensorwasm.compiler.analysis.accesses import collect_accesses
from tensorwasm.compiler.analysis.dependences import static_dependences
from tensorwasm.compiler.analysis.fission import describe, split_sequential, split_stepped, split_wavefront
from tensorwasm.compiler.analysis.forest import MAX_LOOP_DEPTH, FunctionLoops, Reject, at
from tensorwasm.compiler.analysis.induction import LoopValues
from tensorwasm.compiler.analysis.isl import exact_dependences
from tensorwasm.compiler.analysis.liveness import live_ins, live_outs
from tensorwasm.compiler.analysis.nests import collapse_nests, phase_nests
from tensorwasm.compiler.analysis.plan import AnalysisOptions, LoopPlan, LoopReport, TripCount
from tensorwasm.compiler.analysis.privatise import private_copies
from tensorwasm.compiler.analysis.reductions import lane_reductions
from tensorwasm.compiler.analysis.schedule import schedule_phases
from tensorwasm.compiler.analysis.trips import check_affine_bounds, exits_mid_body, guarded_as_top, trip_count
from tensorwasm.compiler.callgraph import reachable
from tensorwasm.compiler.errors import NotCompilable
from tensorwasm.dialect.ir import LoopInfo, Module, Op
from tensorwasm.dialect.types import V128

MEMORY_EFFECTS = {"mem.store", "mem.grow", "mem.copy", "mem.fill", "mem.init", "mem.data_drop"}
STATE_WRITES = {"global.set", "table.set", "table.grow", "table.fill", "table.copy", "table.init",
                "table.elem_drop"}  # fmt: skip


def analyze_module(module: Module, options: AnalysisOptions | None = None) -> list[LoopReport]:
    """A report for every loop of every function of ``module``, in function and loop order."""
    options = options or AnalysisOptions()
    reports = []
    for func in module.functions:
        if func.is_import or not func.loops:
            continue
        facts = FunctionLoops(module, func)
        kept: dict[LoopInfo, LoopValues] = {}
        mine = [analyze_loop(facts, info, options, kept) for info in func.loops]
        collapse_nests(facts, mine)
        if options.distribute:
            schedule_phases(facts, mine, kept)
            phase_nests(facts, mine, kept)
        reports.extend(mine)
    return reports


def analyze_loop(
    facts: FunctionLoops, info: LoopInfo, options: AnalysisOptions, kept: dict | None = None
) -> LoopReport:
    """The verdict on one loop: offload with its plan and guards, or reject with the reason.
    ``kept`` receives the loop's classified values when it is accepted (for :mod:`.schedule`)."""
    try:
        plan = plan_loop(facts, info, options, kept)
    except Reject as exc:
        return LoopReport(facts.func, info, "reject", str(exc), _trip_if_known(facts, info))
    guarded = "guards: " + ", ".join(_guard_summary(plan))
    if plan.fission:
        guarded += "; " + describe(plan)
    return LoopReport(facts.func, info, "offload", guarded, plan.trip, plan)


def plan_loop(
    facts: FunctionLoops, info: LoopInfo, options: AnalysisOptions, kept: dict | None = None
) -> LoopPlan:
    """The plan of a loop that can run as a kernel; :class:`Reject` says why it cannot."""
    if info.returns:
        raise Reject("returns from inside the loop")
    if len(info.exits) != 1:
        raise Reject(f"has {len(info.exits)} ways out (an early exit)" if info.exits else "never exits")
    values = LoopValues(facts, info, options)
    _check_effects(values)
    # Everything below costs the size of the nest inside the loop, in this loop's symbols:
    # a limit on its depth keeps the analysis of a function linear in its size.
    depth = facts.nest_depth(info)
    if depth > MAX_LOOP_DEPTH:
        raise Reject(f"nest deeper than {MAX_LOOP_DEPTH} loops ({depth} deep)")
    values.classify_header_args(info)  # (first: where it rejects, the inner loops are not listed)
    for loop in sorted(values.nested, key=lambda m: m.depth):
        if loop is not info:
            values.classify_header_args(loop)
    values.classify_task_rotations()
    trip = trip_count(values, info)
    inner = []
    for loop in values.nested:
        if loop is info:
            continue
        inner_trip = guarded_as_top(values, loop, trip_count(values, loop))
        # Its bounds may move with the enclosing loops' counters (a triangular or
        # trapezoidal nest): the guards then take its largest count over their box.
        check_affine_bounds(values, loop, inner_trip)
        inner.append((values.counter(loop), inner_trip))
    accesses = collect_accesses(values)
    static_free = static_dependences(values, accesses)
    try:
        exact_free, temporaries = exact_dependences(values, trip, inner, accesses, set(static_free))
        sequential = None
    except Reject as exc:  # it may still split into parallel phases (:mod:`.fission`)
        if not (options.split and str(exc).startswith("sequential")):
            raise
        sequential, exact_free, temporaries = exc, [], []
    static_free += exact_free
    if values.reductions and exits_mid_body(facts, info):
        # Its last iteration leaves from the middle: a thread's part of a reduction would
        # be the half the back edge carries, not the half before the test.
        raise Reject("a reduction in a loop whose exit test is in the middle of its body")
    private = private_copies(values, trip, inner, accesses, temporaries)
    if private and values.rotations:
        raise Reject("privatisable temporary in a loop that carries a load to the next iteration")
    if private and exits_mid_body(facts, info):
        # (its last iteration skips the stores after the test: not every store runs in every iteration)
        raise Reject("privatisable temporary in a loop whose exit test is in the middle of its body")
    for copy in private:  # each thread's own: no pair among its accesses meets another's
        static_free += [(i, j) for i in copy.accesses for j in copy.accesses if accesses[i].store]
    reductions = _vector_lanes(values)
    inputs = live_ins(values)
    outputs = live_outs(values)
    first = len(accesses) - len(values.rotations)  # (the reloads come last)
    rotations = tuple((info.header.args.index(arg), first + n) for n, arg in enumerate(values.rotations))
    plan = LoopPlan(
        facts.func, info, values.counter(info), trip, inner, accesses,
        reductions, inputs, outputs, values.body,
        values.ivs, values.invariant_args, static_free, work=values.work(values.body_order),
        vector_ivs=values.vector_ivs,
        rotations=rotations,
        private=tuple(private),
    )  # fmt: skip
    if sequential is not None:
        try:
            split_sequential(facts, plan, values)
        except Reject as why:
            if not options.stepped:
                raise Reject(f"{sequential}; not split into parallel phases: {why}") from None
            try:
                split_stepped(facts, plan, values)
            except Reject as stepped:
                why = f"{sequential}; not split into parallel phases: {why}; not stepped: {stepped}"
                try:  # no phase over a grid: all serial work in loops, perhaps a wavefront's
                    split_wavefront(facts, plan, values)
                except Reject as wave:
                    raise Reject(f"{why}; {wave}") from None
            children = sum(1 for m in facts.func.loops if m.parent is info)
            if not plan.wave and any(p.pivot or (p.whole and len(p.skip) < children) for p in plan.phases):
                # A child loop on one thread, or one task of it (serial work in loops): a
                # wavefront, if one is legal.
                with contextlib.suppress(Reject):
                    split_wavefront(facts, plan, values)
    if kept is not None:
        kept[info] = values
    return plan


def _vector_lanes(values: LoopValues) -> list:
    """The plan's reductions: a v128 one as one per lane. Its vector's entry value is not a
    live-in (the rewritten module folds the lanes' results into it)."""
    reductions = []
    for reduction in values.reductions.values():
        if reduction.arg.type is not V128:
            reductions.append(reduction)
            continue
        info = values.info
        entry = values.facts.entry_edge_args(info)[info.header.args.index(reduction.arg)]
        # The local holding the vector's entry value, which the lanes' results fold into.
        reduction.local = next((n for n in info.assigned if info.entry_env[n] is entry), None)
        if reduction.local is None:
            raise Reject(f"a v128 reduction ({reduction.lanes}) starts from a value no local holds")
        reduction.init = None
        values.symbols.pop(entry, None)
        reductions.extend(lane_reductions(reduction))
    return reductions


def _check_effects(values: LoopValues) -> None:
    """Reject a body with an effect a kernel cannot have (or that the guards cannot see):
    the first such op in function order."""
    found = first_effect(values.facts, values.info)
    if found is not None:
        raise Reject(found[1])


def first_effect(facts: FunctionLoops, info: LoopInfo) -> tuple[int, str] | None:
    """The first op of ``info``'s body, in function order, that a kernel cannot have: its
    block's position and the reason. Made for every loop of the function at once, inner
    loops first, each from its own blocks and the loops right inside it: each block is read
    once per function, however deep the nest."""
    if not facts.effects:
        inside: dict[LoopInfo, list[LoopInfo]] = {}
        for m, parent in facts.enclosing.items():
            inside.setdefault(parent, []).append(m)
        own = facts.own_blocks()
        for m in sorted(facts.func.loops, key=lambda m: -m.depth):
            found = [facts.effects[k] for k in inside.get(m, ()) if facts.effects[k] is not None]
            for block in own[m]:
                why = _block_effect(facts.module, block)
                if why is not None:
                    found.append((facts.position[block], why))
                    break  # (its own blocks are in function order)
            facts.effects[m] = min(found, default=None)
    return facts.effects[info]


def _block_effect(module: Module, block) -> str | None:
    """Why the block's first op a kernel cannot have cannot be in one; None where all can."""
    for op in block.ops:
        name = op.name
        if name == "func.call_indirect":
            return f"makes an indirect call at {at(op)}"
        if name == "func.call":
            try:
                _check_callee(module, op)
            except Reject as exc:
                return str(exc)
        elif name in MEMORY_EFFECTS - {"mem.store"}:
            return f"{name.replace('mem.', 'memory.')} at {at(op)} changes memory in bulk or its size"
        elif name in STATE_WRITES:
            return f"{name} at {at(op)} writes module state"
        elif name == "cf.return":
            return f"returns from inside the loop at {at(op)}"
    return None


def _check_callee(module: Module, op: Op) -> None:
    """A call is allowed when nothing it reaches touches memory, module state or an import."""
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


def _trip_if_known(facts: FunctionLoops, info: LoopInfo) -> TripCount | None:
    """The trip count of a rejected loop, for the report, when its counter is clear anyway."""
    values = LoopValues(facts, info, AnalysisOptions(relaxed_float=True), lenient=True)
    try:
        # Its own header arguments decide its counter: its start and step come from outside
        # the loop and from the chains of adds that feed its back edges, never from an inner
        # loop's classes (classifying those too made a deep nest cost the cube of its depth).
        values.classify_header_args(info)
        return trip_count(values, info)
    except Reject:
        return None


def _guard_summary(plan: LoopPlan) -> list[str]:
    parts = ["trip count", "accesses in bounds"]
    stores = sum(1 for a in plan.accesses if a.store)
    if stores:
        parts.append(f"{stores} store(s) disjoint from other accesses")
    if plan.gathers and stores:
        parts.append(f"{len(plan.gathers)} gathered load(s) checked in the kernel")
    if plan.private:
        sizes = ", ".join(f"{c.count * c.type.bits // 8} bytes" for c in plan.private)
        parts.append(f"privatised: a copy per thread of {len(plan.private)} temporary array(s) ({sizes})")
    if plan.reductions:
        names = [r.lanes if r.lanes else r.op for r in plan.reductions if not r.lane]
        parts.append("reductions: " + ", ".join(names))
    return parts
