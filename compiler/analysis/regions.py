"""Device-resident regions: a sequential loop whose body is offloaded loops and scalar code.

A time-stepped stencil is the typical case: an outer loop over the steps, not parallel
itself, whose body is one or two parallel loops plus a pointer swap. Offloaded one loop at
a time, every step would copy the arrays to the device and back. A *region* lets them stay
there: inside it, the device copy of linear memory is the current one, launches copy in
only what the device does not hold yet, and the written ranges come back to linear memory
once, when the region ends.

That is sound only where nothing but the offloaded loops can see linear memory while the
region runs. :func:`find_regions` accepts an enclosing ``loop`` when every instruction of
its body outside the offloaded loops

- touches no memory and calls nothing (no load, store, ``memory.*``, call or table op), so
  no Wasm code and no host function reads memory the device holds newer;
- cannot trap (no integer division or remainder by a value that may be 0 or -1, no
  trapping float-to-int conversion, no ``unreachable``), so the guest never stops with the
  device holding its results;

and when no ``return`` in it (the offloaded loops included, which run on the CPU when a
launch declines) leaves the function. The region ends by falling off the loop's ``end`` or
by a branch out of it; the rewritten module calls the host at each place control lands
then (after the ``end`` of a target block, at the top of a target loop: see
:mod:`compiler.rewrite`) to bring the results back. A call there on a path that does not
come from the region finds nothing to bring back. A declined launch inside a region brings
them back before its loop runs on the CPU.

The offloaded loops themselves must not be able to trap on the device: a kernel that traps
has written part of its ranges, over results of earlier launches that exist nowhere else.
So a loop with a gathered load (checked in the kernel), a call, or an instruction that may
trap keeps its data movement per launch, and its enclosing loop is no region.

This works on the instructions of the original module, the same ones the rewriter copies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

# A warm start unpickles Region from the prepared-module cache; the frontend's opcode
# table loads with the search (find_regions) alone.
if TYPE_CHECKING:
    from tensorwasm.compiler.frontend.module import Instr, WasmModule


@functools.cache
def _plain_immediates() -> frozenset:
    """Operands that make an instruction harmless here: control, locals and globals, constants."""
    from tensorwasm.compiler.frontend.opcodes import Imm

    return frozenset(
        {Imm.NONE, Imm.BLOCKTYPE, Imm.LABEL, Imm.BR_TABLE, Imm.LOCAL, Imm.GLOBAL,
         Imm.I32, Imm.I64, Imm.F32, Imm.F64, Imm.SELECT_T}
    )  # fmt: skip


_LEAVING = frozenset({"return", "unreachable"})
_BRANCHES = frozenset({"br", "br_if", "br_table"})
_NESTING = frozenset({"block", "loop", "if"})


@dataclass(frozen=True)
class Region:
    """A loop of function ``func_index`` (instruction indices ``start`` to ``end`` in its
    body, byte offset ``offset``) whose body holds the offloaded loops ``children``
    (indices into the list given to :func:`find_regions`). ``exits`` are the instructions
    after which control continues once it has left the loop."""

    func_index: int
    start: int
    end: int
    offset: int
    children: tuple[int, ...]
    exits: tuple[int, ...]


def traps(body: list[Instr], i: int) -> bool:
    """Whether ``body[i]``, a numeric instruction without immediates, can trap: a trapping
    float-to-int conversion, or an integer division or remainder whose divisor is not a
    constant it cannot trap on (0 for all; -1 for the signed division, by overflow)."""
    name = body[i].op.name
    if not name.startswith(("i32.", "i64.")):
        return False
    op = name[4:]
    if op.startswith("trunc_f"):
        return "_sat_" not in op
    if not op.startswith(("div_", "rem_")):
        return False
    prev = body[i - 1] if i else None
    if prev is None or prev.op.name != f"{name[:3]}.const":
        return True
    return prev.imm == 0 or (op == "div_s" and prev.imm == -1)


def blocker(body: list[Instr], i: int) -> str | None:
    """Why ``body[i]`` may not run in a region outside its offloaded loops (None: it may)."""
    instr = body[i]
    name = instr.op.name
    if instr.op.imm not in _plain_immediates() or name in _LEAVING or name.startswith("ref."):
        return f"{name} at +0x{instr.offset:x}"
    if traps(body, i):
        return f"{name} at +0x{instr.offset:x} may trap"
    return None


def kernel_blocker(body: list[Instr], start: int, end: int) -> str | None:
    """Why the offloaded loop ``body[start]`` might trap on the device (None: it cannot)."""
    for i in range(start + 1, end):
        name = body[i].op.name
        if name in _LEAVING or name.startswith("call") or traps(body, i):
            return f"{name} at +0x{body[i].offset:x} in the loop at +0x{body[start].offset:x}"
    return None


def enclosing(body: list[Instr], start: int) -> list[int]:
    """The ``block``/``loop``/``if`` instructions open at ``body[start]``, outermost first."""
    stack = []
    for i, instr in enumerate(body[:start]):
        if instr.op.name in _NESTING:
            stack.append(i)
        elif instr.op.name == "end" and stack:
            stack.pop()
    return stack


def exits(body: list[Instr], start: int, end: int) -> tuple[int, ...] | str:
    """Where control lands when it leaves the loop ``body[start]``, as the instructions
    after which it continues (the loop's ``end``; a target block's ``end``; a target
    loop's own instruction), or why it may leave the function instead."""
    outer = enclosing(body, start)
    landing = {end}
    depth = 0  # blocks opened inside the loop
    for instr in body[start + 1 : end]:
        name = instr.op.name
        if name in _NESTING:
            depth += 1
        elif name == "end":
            depth -= 1
        elif name == "return":
            return f"return at +0x{instr.offset:x}"
        elif name in _BRANCHES:
            labels = (*instr.imm[0], instr.imm[1]) if name == "br_table" else (instr.imm,)
            for label in labels:
                if label <= depth:  # inside the loop (label == depth is the loop itself)
                    continue
                up = label - depth - 1  # constructs around the loop, innermost 0
                if up >= len(outer):
                    return f"{name} at +0x{instr.offset:x} leaves the function"
                target = outer[-1 - up]
                landing.add(target if body[target].op.name == "loop" else body[target].match)
    return tuple(sorted(landing))


def check(body: list[Instr], start: int, end: int, spans: list[tuple[int, int]]) -> tuple[int, ...] | str:
    """The exits of the loop ``body[start]`` as a region around the offloaded loops
    ``spans`` (first and last instruction of each), or why it cannot be one."""
    inside = sorted(s for s in spans if start < s[0] and s[1] < end)
    for lo, hi in inside:
        why = kernel_blocker(body, lo, hi)
        if why:
            return why
    outside: list[int] = []
    i = start + 1
    for lo, hi in inside:
        outside += range(i, lo)
        i = hi + 1
    outside += range(i, end)
    for k in outside:
        why = blocker(body, k)
        if why:
            return why
    return exits(body, start, end)


def find_regions(wasm: WasmModule, loops: list[tuple[int, int, int, bool]]) -> list[Region]:
    """The outermost regions around ``loops`` (``(func_index, start, end, gathers)`` of
    each offloaded loop, ``gathers`` true where it has a load the kernel checks): for each
    function, every ``loop`` that encloses some of them (those not inside another of them)
    and passes :func:`check`, none inside another."""
    regions = []
    by_func: dict[int, list[tuple[int, int, int]]] = {}
    gathering = {n for n, loop in enumerate(loops) if loop[3]}
    for n, (func, start, end, _) in enumerate(loops):
        by_func.setdefault(func, []).append((start, end, n))
    for func, spans in by_func.items():
        # A loop inside another offloaded loop launches only when that one declines and runs
        # on wasmtime, which reads memory between its launches: it is no region's child.
        spans = [(lo, hi, n) for lo, hi, n in spans if not any(a < lo and hi < b for a, b, _ in spans)]
        body = wasm.codes[func - wasm.num_imported_funcs].body
        taken_until = -1
        for i, instr in enumerate(body):
            if i <= taken_until or instr.op.name != "loop":
                continue
            end = instr.match
            if any(lo <= i <= hi for lo, hi, _ in spans):
                continue  # an offloaded loop or one inside it
            children = tuple(n for lo, hi, n in spans if i < lo and hi < end)
            if not children or gathering.intersection(children):
                continue
            landing = check(body, i, end, [(lo, hi) for lo, hi, _ in spans])
            if isinstance(landing, str):
                continue
            regions.append(Region(func, i, end, instr.offset, children, landing))
            taken_until = end  # an outer region covers the loops inside it
    return regions
