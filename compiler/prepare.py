"""Offload preparation: a module made ready for ``tensorwasm run`` to offload its loops.

:func:`prepare_offload` runs the pipeline (:mod:`compiler.pipeline`) to the ``kernels``
stage for loop kernels: it translates only the loop closure, analyses every loop and
outlines each accepted one (those inside another accepted loop too: they run when the
outer one declines). Then, for each outlined loop, it places the host call before the loop
(:class:`compiler.rewrite.Insertion`, with the Wasm-side filter where the loop is in no
region), finds the device-resident regions around them, rewrites the module, and gives
each call its host signature. The result is a :class:`PreparedModule`, a record the
runtime caches (:mod:`runtime.prepared`), and the compiler's state its kernels are made
from: :func:`compile_loop_kernels` resumes the pipeline from there for a target, to PTX
or to native code, for every kernel or for some (the runtime compiles each kernel on its
own, at its first launch: :mod:`runtime.loop_kernels`).

This module itself imports only records: a warm start reads a cached
:class:`PreparedModule` without the analysis, the outliner or the lowering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.lower import abi
from tensorwasm.support.records import record, replace

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tensorwasm.compiler.analysis.plan import AnalysisOptions, LiveOut, LoopPlan, LoopReport
    from tensorwasm.compiler.analysis.regions import Region
    from tensorwasm.compiler.frontend.module import WasmModule
    from tensorwasm.compiler.pipeline import CompileState, NativeCode, PTXCode, Request
    from tensorwasm.compiler.rewrite import Insertion
    from tensorwasm.compiler.target import Target
    from tensorwasm.dialect.ir import Module
    from tensorwasm.dialect.types import Type


@record(frozen=True)
class PreparedLoop:
    """One offloaded loop: its plan, its kernel, and the host call placed before it."""

    plan: LoopPlan
    kernel_index: int  # the outlined kernel's function index
    insertion: Insertion
    host_sig: tuple[list[Type], list[Type]]  # the host call's (params, results)
    region: int | None = None  # the device-resident region it is in (PreparedModule.regions)
    # Whether its kernel can trap at all (see kernel_may_trap): where it cannot, the host
    # backend runs it in linear memory with nothing kept to undo.
    may_trap: bool = True
    # A tiled kernel's GPU launch shape, (rows, columns, threads across, threads down) of a
    # block's tile (compiler.tile); None where the kernel runs one thread per cell.
    tile: tuple[int, int, int, int] | None = None
    # Iterations each thread of a 1-D kernel runs (compiler.stream: a streaming kernel's
    # chunks); the GPU launch needs that many times fewer threads.
    per_thread: int = 1

    def entry(self, gpu: bool) -> str:
        """The kernel's launch entry in the compiled code."""
        return abi.loop_entry_name(self.kernel_index, gpu)


@record(frozen=True)
class PreparedModule:
    """What offload needs at run time: the rewritten module, the loop reports, each
    offloaded loop (in the order of the host calls ``loop_0``, ``loop_1``, ...), and the
    device-resident regions (``region_<k>``)."""

    rewritten: bytes
    reports: tuple[LoopReport, ...]
    loops: tuple[PreparedLoop, ...]
    regions: tuple[Region, ...]
    # Why no loop of the module is offloaded, where the module itself stands in the way
    # (a 64-bit memory, say): it then runs on wasmtime as it is.
    unsupported: str | None = None

    @property
    def host_sigs(self) -> dict[str, tuple[list[Type], list[Type]]]:
        """Each host call's signature by its import name."""
        return {lp.insertion.import_name: lp.host_sig for lp in self.loops}


@record
class Preparation:
    """A module just prepared: the record to cache, and the compiler's state (its outlined
    kernels) that :func:`compile_loop_kernels` compiles."""

    prepared: PreparedModule
    request: Request
    state: CompileState


def prepare_offload(
    data: bytes, options: AnalysisOptions | None = None, wasm: WasmModule | None = None
) -> Preparation:
    """Prepare the module ``data`` (already decoded as ``wasm``, where given) for offload."""
    from tensorwasm.compiler import degrade, pipeline
    from tensorwasm.compiler.analysis.regions import find_regions
    from tensorwasm.compiler.rewrite import RegionExit, loop_filter, rewrite

    request = pipeline.Request(
        data, entries=pipeline.LOOPS, translate=pipeline.LOOP_CLOSURE, options=options, degrade=True
    )
    state = pipeline.CompileState(wasm=pipeline.DecodedWasm(data, wasm) if wasm is not None else None)
    blocked = pipeline.run(request, "wasm", state=state).wasm.module.offload_blocker()
    if blocked is not None:  # the module runs as it is
        return Preparation(PreparedModule(data, (), (), (), degrade.reason(blocked)), request, state)
    pipeline.run(request, "kernels", state=state)
    wasm = state.wasm.module
    kernels = state.kernels.loops
    scratch: dict[int, list[Type]] = {}  # per function: its locals, then the scratch ones so far
    placed = [insertion_for(wasm, k.plan, f"loop_{n}", scratch) for n, k in enumerate(kernels)]
    insertions = [ins for ins, _ in placed]
    plans = [plan for _, plan in placed]
    spans = [
        (ins.func_index, ins.start, ins.end, bool(k.plan.gathers))
        for ins, k in zip(insertions, kernels, strict=True)
    ]  # fmt: skip
    regions = find_regions(wasm, spans)
    region_of = {n: r for r, region in enumerate(regions) for n in region.children}
    for ins, plan in zip(insertions, plans, strict=True):
        # Every loop has a gate; a region's closes only while nothing of the region is on the
        # device, and any launch in the region opens them all and holds their filters open
        # (a decline must bring its results back: runtime.planning.ArrivalGate).
        ins.filter = loop_filter(plan)
        ins.gate = True
    exits = [RegionExit(r.func_index, r.exits, f"region_{k}") for k, r in enumerate(regions)]
    rewritten = rewrite(wasm, insertions, exits) if kernels else data
    global_types = [g.type for g in wasm.global_types()]
    module = state.dialect.module
    loops = tuple(
        PreparedLoop(
            plan,
            k.index,
            ins,
            host_sig(ins, global_types),
            region_of.get(n),
            kernel_may_trap(module, k.index),
            gpu_tile(module, k.index),
            per_thread(module, k.index),
        )
        for n, (ins, k, plan) in enumerate(zip(insertions, kernels, plans, strict=True))
    )
    reports = degrade.declined_reports(wasm, module, state.loops.reports, degrade.stays_on_wasmtime(wasm))
    # A report points at its loop's plan as the host sees it (its v128 parts in scratch locals).
    host_plans = {id(k.plan): plan for k, plan in zip(kernels, plans, strict=True) if plan is not k.plan}
    reports = tuple(
        replace(r, plan=host_plans[id(r.plan)]) if id(r.plan) in host_plans else r for r in reports
    )
    prepared = PreparedModule(rewritten, reports, loops, tuple(regions))
    return Preparation(prepared, request, state)


# Ops that trap on some operands: integer division, trapping float-to-integer conversion,
# ``unreachable``, table accesses, indirect calls, null checks, and any call (a recursion
# can exhaust the stack). Memory ops trap unless the analysis proved their addresses
# (``proven``: the guards check the whole range before the launch).
TRAPPING_OPS = frozenset({
    "arith.div_s", "arith.div_u", "arith.rem_s", "arith.rem_u", "arith.fptosi", "arith.fptoui",
    "cf.trap", "func.call", "func.call_indirect", "table.get", "table.set", "table.fill",
    "table.copy", "table.init", "ref.as_non_null",
})  # fmt: skip
CHECKED_MEMORY_OPS = frozenset({"mem.load", "mem.store", "mem.copy", "mem.fill", "mem.init"})


def kernel_may_trap(module: Module, index: int) -> bool:
    """Whether the kernel function ``index`` (or anything it calls) has an op that can trap
    (an integer division by a constant that makes it total cannot)."""
    from tensorwasm.compiler.callgraph import reachable
    from tensorwasm.dialect.arith import division_cannot_trap

    for callee in reachable(module, [index]):
        for op in module.functions[callee].ops():
            if op.name in TRAPPING_OPS and not division_cannot_trap(op):
                return True
            if op.name in CHECKED_MEMORY_OPS and not op.attrs.get("proven"):
                return True
    return False


def gpu_tile(module: Module, index: int) -> tuple[int, int, int, int] | None:
    """The GPU launch shape of kernel ``index`` where it is tiled (see ``PreparedLoop.tile``)."""
    tiled = module.functions[index].attrs.get("tiled")
    if tiled is None:
        return None
    shape = tiled.gpu_shape
    return (shape.rows, shape.cols, shape.threads_x, shape.launch_y)


def per_thread(module: Module, index: int) -> int:
    """Iterations each thread of kernel ``index`` runs (see ``PreparedLoop.per_thread``)."""
    streaming = module.functions[index].attrs.get("streaming")
    return streaming.iterations if streaming is not None else 1


def compile_loop_kernels(
    preparation: Preparation, target: Target, indices: Iterable[int] | None = None
) -> PTXCode | NativeCode:
    """The prepared loops' kernels compiled for ``target``: PTX for a GPU, else native code.
    ``indices`` (kernel function indices) picks the kernels, with what they call, into a
    compile unit of their own; None takes them all."""
    from tensorwasm.compiler import pipeline

    kernels = preparation.state.kernels
    if indices is not None:
        wanted = set(indices)
        missing = wanted - {k.index for k in kernels.loops}
        if missing:
            raise ValueError(f"no loop kernel at function index {min(missing)}")
        kernels = replace(kernels, loops=tuple(k for k in kernels.loops if k.index in wanted))
    state = replace(preparation.state, kernels=kernels, llvm=None, ptx=None, native=None)
    pipeline.run(replace(preparation.request, target=target), state=state)
    return state.ptx if target.is_gpu else state.native


def insertion_for(
    wasm: WasmModule, plan: LoopPlan, import_name: str, scratch: dict[int, list[Type]] | None = None
) -> tuple[Insertion, LoopPlan]:
    """Where the host call for ``plan``'s loop goes, and what it passes and receives; and
    the plan as the host sees it (:func:`v128_scratch`). ``scratch``: the locals of the
    functions prepared so far, scratch ones included, by function index."""
    from tensorwasm.compiler.rewrite import Insertion

    index = plan.func.index
    sig = wasm.func_sig(index)
    own = list(sig.params) + wasm.codes[index - wasm.num_imported_funcs].locals
    local_types = (scratch or {}).get(index, own)
    plan, moves, folds, local_types = v128_scratch(plan, local_types)
    if scratch is not None:
        scratch[index] = local_types
    locals_ = [i for _, _, kind, i in plan.live_ins if kind == "local"]
    globals_ = [i for _, _, kind, i in plan.live_ins if kind == "global"]
    # The host receives the live-ins in plan order: locals first, then globals (the
    # analysis orders them so, and the kernel's parameters follow the same order).
    insertion = Insertion(index, plan.loop.start, plan.loop.end, locals_, globals_,
                          [lo.local for lo in returned(plan)], local_types, import_name,
                          moves=moves, folds=folds, own_locals=len(own))  # fmt: skip
    return insertion, plan


def v128_scratch(plan: LoopPlan, local_types: list[Type]) -> tuple[LoopPlan, list, list, list[Type]]:
    """The plan with its v128 parts in scratch locals added after ``local_types``: each
    v128 live-in half in an i64 local (and the move that fills it), each lane of a v128
    reduction returned in a local of the lane's type (and the fold that combines them into
    the vector's local); ``plan`` itself where it has none. The kernel is the same."""
    from tensorwasm.compiler.analysis.plan import LiveOut
    from tensorwasm.dialect.types import I64

    if not any(kind.startswith("v128 ") for _, _, kind, _ in plan.live_ins) and not any(
        r.vector is not None for r in plan.reductions
    ):
        return plan, [], [], local_types
    local_types = list(local_types)
    live_ins, moves = [], []
    for value, sym, kind, index in plan.live_ins:
        if kind.startswith("v128 "):
            moves.append((len(local_types), kind.removeprefix("v128 "), index, value.owner.attrs["lane"]))
            live_ins.append((value, sym, "local", len(local_types)))
            local_types.append(I64)
        else:
            live_ins.append((value, sym, kind, index))
    live_outs, folds = [], []
    for live in plan.live_outs:
        vector = live.reduction
        if live.kind != "reduction" or not vector.lanes:
            live_outs.append(live)
            continue
        lanes = [r for r in plan.reductions if r.vector is vector.arg]
        first = len(local_types)
        for r in lanes:
            live_outs.append(LiveOut(len(local_types), "reduction", reduction=r))
            local_types.append(r.arg.type)
        folds.append((live.local, vector.local, vector.lanes, tuple(range(first, len(local_types))),
                      lanes[0].init.constant))  # fmt: skip
    return replace(plan, live_ins=live_ins, live_outs=live_outs), moves, folds, local_types


def returned(plan: LoopPlan) -> list[LiveOut]:
    """The live-outs the host hands back: a local not read after the loop keeps its value
    (wasmtime-py converts every value crossing the boundary, at a cost per value)."""
    return [live for live in plan.live_outs if live.kind != "dead"]


def host_sig(ins: Insertion, global_types: list[Type]) -> tuple[list[Type], list[Type]]:
    """The host call's (params, results)."""
    from tensorwasm.compiler.rewrite import host_signature

    sig = host_signature(ins, global_types)
    return sig.params, sig.results
