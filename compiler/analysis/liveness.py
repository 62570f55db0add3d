"""What a loop kernel takes in and what the loop leaves behind.

Live-ins are the values the body reads that come from before the loop: each must be held
by a local at loop entry (the rewritten module passes locals and globals to the host), or
be pure arithmetic on such values, which the kernel recomputes; a compare that a local
holds widened to 0 or 1 is tested again from the local. Globals the body reads, the
symbols of induction variables' starts and of trip counts join them: locals first, then
globals, in body order, which fixes the order of the kernel's parameters. A ``v128``
live-in crosses as its two 64-bit halves, low first: two i64 live-ins of kind "v128
local" (or "v128 global") naming the vector's local (global), each the ``i64x2``
lane read out of the vector (an op of no block, see :func:`v128_halves`); the kernel
builds the vector again from them.

Live-outs are the loop's assigned locals as the code after the loop sees them: "dead"
when nothing after the loop reads them, a "reduction"'s combined value, or an "affine"
value at the exit iteration (a polynomial in the loop's counter, free of inner counters).
Any other value of the body read after the loop rejects it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject, at
from tensorwasm.compiler.analysis.plan import LiveOut
from tensorwasm.dialect import arith, simd
from tensorwasm.dialect.ir import Op, Value
from tensorwasm.dialect.types import I64, V128

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.compiler.analysis.poly import Symbol


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


def live_ins(values: LoopValues) -> list[tuple[Value, Symbol, str, int]]:
    """The kernel's inputs: (value, symbol, "local" or "global", its index)."""
    entry = values.info.entry_env
    seen: dict[Value, tuple[Value, Symbol, str, int]] = {}
    for block in values.body_order:
        for op in block.ops:
            operands = list(op.operands) + [v for s in op.successors for v in s.args]
            for v in operands:
                _live_in(values, v, entry, seen)
            if op.name == "global.get":
                index = op.attrs["index"]
                values.expr(op.results[0])
                key = op.results[0]
                seen[key] = (key, values.globals[index], "global", index)
    # IV start values are live-ins too (they flow in on the entry edge).
    for start, _ in values.ivs.values():
        for sym in start.leaves():
            if sym.kind == "value" and sym.ref not in seen:
                local = next((i for i, e in enumerate(entry) if e is sym.ref), None)
                if local is None:
                    raise Reject("an induction variable starts from a value no local holds")
                seen[sym.ref] = (sym.ref, sym, "local", local)
    for start, _, _ in values.vector_ivs.values():  # a v128 induction vector's start too
        _live_in(values, start, entry, seen)
    for sym in values.symbols.values():
        if sym.ref not in seen and sym.kind == "value":
            local = next((i for i, e in enumerate(entry) if e is sym.ref), None)
            if local is None:
                raise Reject("the trip count depends on a value no local holds")
            seen[sym.ref] = (sym.ref, sym, "local", local)
    # Locals first, then globals: the order of the kernel's parameters and of the
    # values the rewritten module passes to the host.
    # (A v128 global's halves come in through scratch locals: they count as locals.)
    halves = [half for item in seen.values() for half in v128_halves(values, item)]
    return sorted(halves, key=lambda item: item[2] == "global")


def v128_halves(values: LoopValues, item: tuple) -> list[tuple[Value, Symbol, str, int]]:
    """A live-in as it crosses into the kernel: itself, or a v128's two i64 halves."""
    value, _, kind, index = item
    if value.type is not V128:
        return [item]
    halves = []
    for lane in (0, 1):
        half = Op(simd.extract_lane, [value], (I64,), {"op": "i64x2.extract_lane", "lane": lane}).results[0]
        halves.append((half, values.symbol_for(half), f"v128 {kind}", index))
    return halves


def _live_in(values: LoopValues, v: Value, entry: list, seen: dict) -> None:
    """Record what the kernel needs for ``v``, a value the body reads: nothing for a
    constant or a body value, the local holding it, or (a value no local holds, such
    as a comparison clang hoisted) the same for the operands it is recomputed from."""
    if v in seen or values.facts.def_block.get(v) in values.body:
        return
    owner = v.owner
    if isinstance(owner, Op) and owner.opdef is arith.constant:
        return
    local = next((i for i, e in enumerate(entry) if e is v), None)
    if local is not None:
        seen[v] = (v, values.symbol_for(v), "local", local)
        return
    widened = widened_in(v, entry)
    if widened is not None:  # a compare a local holds as 0 or 1: the kernel tests it
        seen[entry[widened]] = (entry[widened], values.symbol_for(entry[widened]), "local", widened)
        return
    if isinstance(owner, Op) and owner.name.startswith(("arith.", "simd.")) and owner.opdef.pure:
        for operand in owner.operands:
            _live_in(values, operand, entry, seen)
        return
    raise Reject("uses a value computed before the loop that no local holds")


def used_outside(values: LoopValues, value: Value) -> bool:
    """Something after the loop reads ``value`` (an op outside the body, or an edge out)."""
    for op, block in values.facts.users.get(value, []):
        if block not in values.body and not _ignored_by_shuffle(op, value):
            return True
        if any(value in s.args and s.block not in values.body for s in op.successors):
            return True
    return False


def _ignored_by_shuffle(op: Op, value: Value) -> bool:
    """``op`` is a shuffle that picks no byte of ``value`` (clang fills the unused operand
    of a shuffle with whatever vector is at hand, often the loop's last loaded one)."""
    if op.name != "simd.shuffle":
        return False
    picked = {index >= 16 for index in op.attrs["lanes"]}
    return all(operand is not value or (n == 1) not in picked for n, operand in enumerate(op.operands))


def live_outs(values: LoopValues) -> list[LiveOut]:
    """How each local the loop assigns is found after it; :class:`Reject` where it cannot be."""
    info = values.info
    _, exit_env = info.exits[0]
    k = values.counter(info)
    outs = []
    by_update = {r.update: r for r in values.reductions.values()}
    exported = set()
    for local in info.assigned:
        value = exit_env[local]
        exported.add(value)
        if not used_outside(values, value):
            outs.append(LiveOut(local, "dead"))
            continue
        reduction = by_update.get(value) or values.reductions.get(value)
        if reduction is not None:
            outs.append(LiveOut(local, "reduction", reduction=reduction))
            continue
        poly = values.expr(value)
        counters = {c for c in values.counters.values() if c is not k}
        if poly is None or poly.leaves() & counters:
            raise Reject(f"local {local}'s value from the last iteration is used after the loop")
        outs.append(LiveOut(local, "affine", value=poly))
    for block in values.body_order:
        for op in block.ops:
            for r in op.results:
                if r not in exported and used_outside(values, r):
                    raise Reject(f"a value computed in the loop at {at(op)} is used after it")
        for arg in block.args:
            if arg not in exported and used_outside(values, arg) and arg not in values.invariant_args:
                raise Reject("a loop value is used after the loop without a local to carry it")
    return outs
