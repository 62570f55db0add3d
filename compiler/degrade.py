"""What stays on wasmtime in a module ``tensorwasm run`` runs although the compiler cannot
translate all of it.

A module decoded with ``degrade`` (:func:`compiler.frontend.load`) marks each function
that uses a proposal TensorWasm does not compile (:meth:`WasmModule.untranslatable`). Such
a function stays on wasmtime, untouched, and so does every function one of whose loops
calls into it, directly or through what it calls (a loop kernel runs everything the loop
calls). :func:`stays_on_wasmtime` names them with the reason; the offload preparation
translates none of them and reports their loops declined with that reason
(:func:`declined_reports`), while the loops of every other function are analysed as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.errors import UnsupportedFeature

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import LoopReport
    from tensorwasm.compiler.errors import DecodeError
    from tensorwasm.compiler.frontend.module import WasmModule
    from tensorwasm.dialect.ir import Module

_CALLS = frozenset({"call", "return_call"})


def reason(exc: DecodeError) -> str:
    """The short reason a report gives for ``exc``."""
    return exc.uses() if isinstance(exc, UnsupportedFeature) else exc.reason


def stays_on_wasmtime(wasm: WasmModule) -> dict[int, str]:
    """The defined functions left to wasmtime, by index, with the reason."""
    bad = {index: reason(exc) for index, exc in wasm.untranslatable().items()}
    if not bad:
        return {}
    first = wasm.num_imported_funcs
    calls = {
        first + n: {i.imm for i in code.body if i.op.name in _CALLS and i.imm >= first}
        for n, code in enumerate(wasm.codes)
    }
    leads_to = _paths_to(bad, calls)
    stays = {index: f"the function {why}" for index, why in bad.items()}
    for n, code in enumerate(wasm.codes):
        index = first + n
        if index in stays:
            continue
        body = code.body
        for lo, instr in enumerate(body):
            if instr.op.name != "loop":
                continue
            callee = next(
                (i.imm for i in body[lo + 1 : instr.match] if i.op.name in _CALLS and i.imm in leads_to), None
            )
            if callee is not None:
                target = leads_to[callee]
                via = "" if target == callee else f" and through it {wasm.func_name(target)}"
                stays[index] = (
                    f"its loop at +0x{instr.offset:x} calls {wasm.func_name(callee)}{via}, "
                    f"which {bad[target]}"
                )
                break
    return stays


def _paths_to(bad: dict[int, str], calls: dict[int, set[int]]) -> dict[int, int]:
    """Each function from which calls reach an untranslatable one: the one it reaches."""
    callers: dict[int, list[int]] = {}
    for caller, callees in calls.items():
        for callee in callees:
            callers.setdefault(callee, []).append(caller)
    found = {index: index for index in bad}
    work = list(bad)
    while work:
        index = work.pop()
        for caller in callers.get(index, ()):
            if caller not in found:
                found[caller] = found[index]
                work.append(caller)
    return found


def declined_reports(
    wasm: WasmModule, module: Module, reports: tuple[LoopReport, ...], stays: dict[int, str]
) -> tuple[LoopReport, ...]:
    """``reports`` with one declined report for each loop of a function in ``stays``, in
    function and loop order (``module`` holds each such function as an untranslated stub)."""
    from tensorwasm.compiler.analysis.plan import LoopReport
    from tensorwasm.dialect.ir import LoopInfo

    if not stays:
        return reports
    first = wasm.num_imported_funcs
    extra = []
    for index, why in stays.items():
        around: list[tuple[int, LoopInfo]] = []  # the loops open at this point: (end index, loop)
        for i, instr in enumerate(wasm.codes[index - first].body):
            while around and around[-1][0] < i:
                around.pop()
            if instr.op.name != "loop":
                continue
            parent = around[-1][1] if around else None
            # A loop nobody translated has no header block: the report needs none.
            info = LoopInfo(None, instr.offset, len(around) + 1, parent, i, instr.match)  # type: ignore[arg-type]
            around.append((instr.match, info))
            extra.append(LoopReport(module.functions[index], info, "reject", why))
    return tuple(sorted([*reports, *extra], key=lambda r: r.func.index))  # (stable: loop order kept)
