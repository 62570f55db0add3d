"""The compiler's stages, declared once, in order; every user runs this one list.

``wasm`` (decode and validate) -> ``dialect`` (translate and verify) -> ``loops`` (analyse
the loops) -> ``kernels`` (choose the entry points: whole functions, or outlined loops) ->
``llvm`` (lower) -> ``ptx`` (NVPTX) or ``native`` (host object code). Each stage is a
:class:`Stage`: its name, the function that runs it, the record type of its result and,
where ``tensorwasm inspect --stage`` can print it, the function that prints that record.

A :class:`Request` says what to compile: the Wasm bytes, which functions, whether the
kernels are whole functions (``compile``, ``invoke``) or the loops the analysis accepts
(``run``'s offload, :mod:`compiler.prepare`), and for the back half the target. A stage
that the request does not need is passed over (``loops`` for whole functions; ``ptx`` on
the host, ``native`` on a GPU; the back half without a target). :func:`run` runs the list
into a :class:`CompileState` that holds each stage's result under the stage's name; it can
stop after a named stage, hand each result to a callback as it comes (a dump), and resume
a state an earlier run (or its caller) filled, after the last stage found in it.

:func:`compile_entries` is the whole-function path with the code cache in front of it.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.callgraph import reachable
from tensorwasm.compiler.errors import CompileError, NotCompilable
from tensorwasm.compiler.lower.abi import entry_name
from tensorwasm.support import logs
from tensorwasm.support.digest import sha256
from tensorwasm.support.records import field, record

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from tensorwasm.compiler.analysis.plan import AnalysisOptions, LoopPlan, LoopReport
    from tensorwasm.compiler.frontend.module import WasmModule
    from tensorwasm.compiler.lower.function import LowerOptions, ModuleLowering
    from tensorwasm.compiler.target import HostCode, Target
    from tensorwasm.dialect.ir import Module

log = logs.get_logger(__name__)

# What the kernels are (Request.entries).
FUNCTIONS = "functions"  # whole functions, each a one-thread kernel (compile, invoke)
LOOPS = "loops"  # the loops the analysis accepts, outlined into iteration kernels (run)

# Which functions the dialect stage translates (Request.translate).
MODULE = "module"  # every defined function
SELECTED = "selected"  # only Request.functions (all where it is None)
LOOP_CLOSURE = "loop-closure"  # functions with loops and what their loops call


# -- what to compile ------------------------------------------------------------------


@record(frozen=True)
class Request:
    """What to compile, and the choices the stages read."""

    data: bytes = b""  # the Wasm binary (the wasm stage's input)
    entries: str = FUNCTIONS
    translate: str = MODULE
    functions: tuple[int, ...] | None = None  # the functions asked for (None: every defined one)
    options: AnalysisOptions | None = None  # the loops stage's
    target: Target | None = None  # the llvm, ptx and native stages'
    lower_options: LowerOptions | None = None
    # The wasm stage's: mark what the compiler cannot translate instead of refusing the
    # module (offload: those functions stay on wasmtime; see compiler.degrade).
    degrade: bool = False

    def __post_init__(self) -> None:
        if self.entries not in (FUNCTIONS, LOOPS):
            raise ValueError(f"entries must be {FUNCTIONS!r} or {LOOPS!r}, not {self.entries!r}")
        if self.translate not in (MODULE, SELECTED, LOOP_CLOSURE):
            raise ValueError(f"translate must be {MODULE!r}, {SELECTED!r} or {LOOP_CLOSURE!r}")


@record(frozen=True)
class View:
    """What a stage's printout shows: these functions only (None: all), as text or JSON."""

    functions: frozenset[int] | None = None
    format: str = "text"


# -- the stages' results --------------------------------------------------------------


@record(frozen=True)
class DecodedWasm:
    """``wasm``: the binary and its decoded, validated module."""

    data: bytes
    module: WasmModule


@record(frozen=True)
class DialectModule:
    """``dialect``: the module translated to the dialect and verified (the ``kernels``
    stage appends outlined loop kernels to it)."""

    module: Module


@record(frozen=True)
class LoopReports:
    """``loops``: the analysis's verdict on every loop, in function and loop order."""

    reports: tuple[LoopReport, ...]


@record(frozen=True)
class LoopKernel:
    """A loop outlined into an iteration kernel: its plan and the kernel's function index."""

    plan: LoopPlan
    index: int


@record(frozen=True)
class Kernels:
    """``kernels``: the entry points the back half lowers. Whole functions by index (those
    whose call closure reaches a host import are left out, with the reason), or outlined
    loops, in the order of their reports."""

    functions: tuple[int, ...] = ()
    skipped: dict[int, str] = field(default_factory=dict)  # function index -> why it is left out
    loops: tuple[LoopKernel, ...] = ()


@record(frozen=True)
class LLVMModule:
    """``llvm``: one LLVM module holding every entry point and what it reaches."""

    text: str
    entries: dict[int, str]  # kernel's function index -> entry symbol


@record(frozen=True)
class PTXCode:
    """``ptx``: the module's PTX; None where it has no entry point."""

    text: str | None
    entries: dict[int, str]

    @property
    def sha256(self) -> str | None:
        return sha256(self.text.encode()).hexdigest() if self.text is not None else None


@record(frozen=True)
class NativeCode:
    """``native``: the module compiled for this machine, loaded, with its object code."""

    code: HostCode
    entries: dict[int, str]

    @property
    def obj(self) -> bytes:
        return self.code.object


@record
class CompileState:
    """Each stage's result by the stage's name; None where it has not run."""

    wasm: DecodedWasm | None = None
    dialect: DialectModule | None = None
    loops: LoopReports | None = None
    kernels: Kernels | None = None
    llvm: LLVMModule | None = None
    ptx: PTXCode | None = None
    native: NativeCode | None = None


# -- the stages -----------------------------------------------------------------------


def _decode(request: Request, state: CompileState) -> DecodedWasm:
    from tensorwasm.compiler.frontend import load

    return DecodedWasm(request.data, load(request.data, degrade=request.degrade))


def _translate(request: Request, state: CompileState) -> DialectModule:
    from tensorwasm.compiler.degrade import stays_on_wasmtime
    from tensorwasm.compiler.frontend.translate import loop_closure, translate_module

    wasm = state.wasm.module
    only = None
    if request.translate == LOOP_CLOSURE:
        only = loop_closure(wasm) - stays_on_wasmtime(wasm).keys()
    elif request.translate == SELECTED and request.functions is not None:
        only = set(request.functions)
    return DialectModule(translate_module(wasm, only=only))


def _analyse(request: Request, state: CompileState) -> LoopReports:
    from tensorwasm.compiler.analysis.loops import analyze_module

    return LoopReports(tuple(analyze_module(state.dialect.module, request.options)))


def _choose_kernels(request: Request, state: CompileState) -> Kernels:
    module = state.dialect.module
    if request.entries == LOOPS:
        from tensorwasm.compiler.outline import outline

        accepted = [r.plan for r in state.loops.reports if r.verdict == "offload"]
        return Kernels(loops=tuple(LoopKernel(plan, outline(module, plan).index) for plan in accepted))
    indices = request.functions if request.functions is not None else defined_functions(module)
    ok, skipped = compilable(module, indices)
    return Kernels(functions=tuple(ok), skipped=skipped)


def _lower(request: Request, state: CompileState) -> LLVMModule:
    from tensorwasm.compiler.lower.function import ModuleLowering

    kernels = state.kernels
    lowering = ModuleLowering(state.dialect.module, request.target, request.lower_options)
    if request.entries == LOOPS:
        entries = _lower_loop_entries(lowering, kernels.loops)
    else:
        names = lowering.lower_entries(kernels.functions)
        entries = dict(zip(kernels.functions, names, strict=True))
    return LLVMModule(str(lowering.llvm), entries)


def _lower_loop_entries(lowering: ModuleLowering, loops: tuple[LoopKernel, ...]) -> dict[int, str]:
    """Every function the loop kernels reach, then each kernel's launch entry."""
    from tensorwasm.compiler.callgraph import recursive_functions
    from tensorwasm.compiler.lower.function import FunctionLowering, lower_loop_entry

    module = lowering.dialect
    closure = reachable(module, [k.index for k in loops])
    lowering.recursive = recursive_functions(module, closure)
    for index in closure:
        FunctionLowering(lowering, module.functions[index]).lower()
    return {k.index: lower_loop_entry(lowering, k.index, [r.op for r in k.plan.reductions]) for k in loops}


def _emit_ptx(request: Request, state: CompileState) -> PTXCode:
    llvm_module = state.llvm
    text = request.target.emit_ptx(llvm_module.text) if llvm_module.entries else None
    return PTXCode(text, llvm_module.entries)


def _emit_native(request: Request, state: CompileState) -> NativeCode:
    return NativeCode(request.target.jit(state.llvm.text), state.llvm.entries)


# -- what each stage prints (tensorwasm inspect --stage NAME) ----------------------------


def _show_wasm(result: DecodedWasm, view: View) -> str:
    from tensorwasm.compiler.frontend.printer import print_module

    return print_module(result.module, view.functions)


def _show_dialect(result: DialectModule, view: View) -> str:
    from tensorwasm.dialect.printer import print_function

    module = result.module
    indices = sorted(view.functions) if view.functions is not None else defined_functions(module)
    out = []
    for index in indices:
        func = module.functions[index]
        if func.is_import:
            out.append(f"func @{func.name} import {func.import_name[0]!r}.{func.import_name[1]!r}\n")
        else:
            out.append(print_function(func))
    return "".join(out)


def _show_loops(result: LoopReports, view: View) -> str:
    import json

    out = []
    for report in result.reports:
        if view.functions is not None and report.func.index not in view.functions:
            continue
        if view.format == "json":
            out.append(json.dumps(report.as_json()) + "\n")
            continue
        trip = report.trip.describe() if report.trip else "unknown"
        out.append(
            f"{report.func.name} +0x{report.loop.offset:x} depth {report.loop.depth}: "
            f"{report.verdict}; trip count {trip}; {report.reason}\n"
        )
    return "".join(out)


def _show_llvm(result: LLVMModule, view: View) -> str:
    return result.text


def _show_ptx(result: PTXCode, view: View) -> str:
    return result.text or ""


# -- the list -------------------------------------------------------------------------


def _always(request: Request) -> bool:
    return True


def _for_loops(request: Request) -> bool:
    return request.entries == LOOPS


def _with_target(request: Request) -> bool:
    return request.target is not None


def _for_gpu(request: Request) -> bool:
    return request.target is not None and request.target.is_gpu


def _for_host(request: Request) -> bool:
    return request.target is not None and not request.target.is_gpu


@record(frozen=True)
class Stage:
    """One step of the pipeline."""

    name: str  # also the CompileState field that holds its result
    run: Callable[[Request, CompileState], Any]  # reads the earlier stages' results
    result: type  # the record type ``run`` returns
    about: str  # one line: what it does
    show: Callable[[Any, View], str] | None = None  # its printout (inspect); None: not printable
    applies: Callable[[Request], bool] = _always  # whether a request needs it


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage("wasm", _decode, DecodedWasm, "decode and validate the binary", _show_wasm),
        Stage("dialect", _translate, DialectModule, "translate to the dialect and verify", _show_dialect),
        Stage("loops", _analyse, LoopReports, "analyse every loop for offload", _show_loops, _for_loops),
        Stage("kernels", _choose_kernels, Kernels, "choose whole functions, or outline accepted loops"),
        Stage("llvm", _lower, LLVMModule, "lower the kernels to LLVM IR", _show_llvm, _with_target),
        Stage("ptx", _emit_ptx, PTXCode, "optimise and generate PTX", _show_ptx, _for_gpu),
        Stage("native", _emit_native, NativeCode, "optimise and compile for this machine", None, _for_host),
    )
}


def printable_stages() -> list[str]:
    """The stages ``inspect --stage`` prints, in pipeline order."""
    return [name for name, stage in STAGES.items() if stage.show is not None]


def run(
    request: Request,
    stop: str | None = None,
    *,
    state: CompileState | None = None,
    dump: Callable[[Stage, Any], None] | None = None,
) -> CompileState:
    """Run the stages ``request`` needs, in order, into ``state`` (a new one by default,
    else from the stage after the last one it holds), up to ``stop`` if given; ``dump``
    gets each stage and its result as it comes."""
    if stop is not None:
        if stop not in STAGES:
            raise CompileError(f"no stage {stop!r}: the stages are {', '.join(STAGES)}")
        if not STAGES[stop].applies(request):
            raise CompileError(f"the {stop} stage does not apply to this request ({STAGES[stop].about})")
    state = state if state is not None else CompileState()
    stages = list(STAGES.values())
    done = [n for n, stage in enumerate(stages) if getattr(state, stage.name) is not None]
    last = list(STAGES).index(stop) if stop is not None else len(stages) - 1
    with cycle_collection_paused():
        for stage in stages[done[-1] + 1 if done else 0 : last + 1]:
            if stage.applies(request):
                result = stage.run(request, state)
                setattr(state, stage.name, result)
                if dump is not None:
                    dump(stage, result)
    return state


@contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Python's cycle collector off while the stages run. The stages build millions of
    objects that stay alive until the end (the IR, llvmlite's), and every full collection
    walks all of them: with the collector on, lowering N functions cost O(N^1.3) and more
    (4000 functions: 5.6 s, against 2.9 s with it off). Cycles left as garbage meanwhile
    are collected once it is on again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# -- whole functions ------------------------------------------------------------------


def defined_functions(module: Module) -> list[int]:
    """The indices of the module's defined (not imported) functions."""
    return [f.index for f in module.functions if not f.is_import]


def compilable(module: Module, indices: Iterable[int]) -> tuple[list[int], dict[int, str]]:
    """Split ``indices`` into functions the compiler can take and those it cannot (why)."""
    ok, skipped = [], {}
    for index in indices:
        func = module.functions[index]
        if func.is_import:
            skipped[index] = f"{func.name} is a host import ({func.import_name[0]}.{func.import_name[1]})"
            continue
        try:
            reachable(module, [index])
        except NotCompilable as exc:
            skipped[index] = f"{func.name} {exc}"
            continue
        ok.append(index)
    return ok, skipped


@record
class Compilation:
    """The result of compiling some functions of a module for one target."""

    target: Target
    llvm_ir: str
    entries: dict[int, str]  # function index -> entry symbol
    skipped: dict[int, str] = field(default_factory=dict)  # function index -> reason
    ptx: str | None = None
    seconds: float = 0.0
    obj: bytes | None = None  # host object code, when it came from a cache
    cached: bool = False

    @property
    def ptx_sha256(self) -> str | None:
        return sha256(self.ptx.encode()).hexdigest() if self.ptx is not None else None


def compile_entries(
    module: Module,
    target: Target,
    indices: Iterable[int],
    options: LowerOptions | None = None,
    cache=None,
    key: str | None = None,
) -> Compilation:
    """Lower the given functions' entry points and, for NVPTX, generate the PTX (the
    pipeline from ``kernels`` on, over a translated module). With a ``cache`` and ``key``,
    a cached PTX (or host object code) skips lowering altogether."""
    start = time.perf_counter()
    request = Request(functions=tuple(indices), target=target, lower_options=options)
    state = CompileState(dialect=DialectModule(module))
    if cache is not None and key is not None:
        kind = "ptx" if target.is_gpu else "obj"
        hit = cache.get(kind, key)
        if hit is not None:
            kernels = run(request, "kernels", state=state).kernels
            entries = {i: entry_name(i) for i in kernels.functions}
            ptx = hit.decode("ascii") if kind == "ptx" else None
            return Compilation(target, "", entries, kernels.skipped, ptx, time.perf_counter() - start,
                               None if ptx else hit, cached=True)  # fmt: skip
    run(request, "ptx" if target.is_gpu else "llvm", state=state)
    ptx = state.ptx.text if state.ptx is not None else None
    if ptx is not None and cache is not None and key is not None:
        cache.put("ptx", key, ptx.encode("ascii"))
    seconds = time.perf_counter() - start
    entries = state.llvm.entries
    log.info("compiled %d functions for %s in %.1f ms", len(entries), target.name, seconds * 1e3)
    return Compilation(target, state.llvm.text, entries, state.kernels.skipped, ptx, seconds)


def exported_functions(wasm: WasmModule) -> list[int]:
    seen: list[int] = []
    for export in wasm.exports:
        if export.kind == "func" and export.index not in seen:
            seen.append(export.index)
    return seen
