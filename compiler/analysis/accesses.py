"""Memory accesses of a loop as polynomials in the loops' counters and the live-in values.

Every load and store in the candidate loop's body (inner loops included, in function
order) gets its address from :meth:`LoopValues.expr` plus its static offset. The address
is kept only where it is affine in each counter of the nest (its coefficient of a counter
is free of counters); otherwise it is unknown. An unknown store address rejects the loop:
nothing could say which iterations it meets. An unknown load address is a *gather*: the
kernel checks each address it loads against the ranges the loop writes (see
:attr:`LoopPlan.gathers`). An access after an inner loop rather than inside it may see that
loop's counter at its exit value; those counters are listed in ``beyond``.

A value clang carries to the next iteration may be a load the next iteration would make
itself (``A[i + 1]`` kept for the next ``A[i]``): :func:`rotated_load` recognises it, and the
kernel reloads it from the previous iteration's address, an access of its own here, which
the guards keep apart from every store like any other load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject
from tensorwasm.compiler.analysis.plan import Access
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.dialect.ir import Op

if TYPE_CHECKING:
    from collections.abc import Callable

    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.dialect.ir import Block, LoopInfo, Value


def collect_accesses(values: LoopValues) -> list[Access]:
    """The loads and stores of the candidate loop, in function order; :class:`Reject` for a
    store whose address is not affine."""
    out = []
    counters = set(values.counters.values())
    for block in values.body_order:
        for op in block.ops:
            if op.name not in ("mem.load", "mem.store"):
                continue
            address = values.expr(op.operands[0])
            if address is not None:
                address = address + Poly.const(op.attrs["offset"])
                for c in [s for s in address.symbols() if s.leaves() & counters]:
                    split = address.split(c)
                    if split is None or split[1].leaves() & counters or not _quasi_affine(c, counters):
                        address = None
                        break
            beyond = frozenset(
                sym for loop, sym in values.counters.items()
                if loop is not values.info and address is not None and sym in address.leaves()
                and block not in values.facts.bodies[loop]
            )  # fmt: skip
            out.append(
                Access(op, op.name == "mem.store", op.attrs["bits"] // 8, address, op.attrs["offset"], beyond)
            )
    out += [reload_access(values, values.info, load, address) for load, address in values.rotations.values()]
    for a in out:
        if a.address is None:
            if a.store:
                raise Reject(f"store at {a.where} writes an address that is not affine in the loop counters")
            # A gather: its addresses are unknown before the launch, so the kernel checks
            # each one against the ranges the loop writes (see LoopPlan.gathers).
    return out


def _quasi_affine(sym, counters: set) -> bool:
    """A counter, or the floor of a value affine in the counters (an unrolled loop's
    ``i & -4``): isl models it exactly, the guards bound it."""
    if sym.kind != "floor":
        return True
    inner = sym.ref[0]
    for s in inner.symbols():
        if s.kind == "floor":
            return False
        if s in counters:
            split = inner.split(s)
            if split is None or split[1].leaves() & counters:
                return False
    return True


def rotated_load(values: LoopValues, arg: Value, back: Value, entry: Value) -> bool:
    """Record header argument ``arg`` of the candidate loop as a rotated load, when it is:
    the back edge passes a load of the body's own iteration (not of an inner loop) at an
    address affine in the loop's counter alone, and the loop is entered with a load of the
    same kind at that address one iteration before (``P(-1)``), made in the block that
    enters the loop with nothing after it that writes memory. Each iteration then sees the
    load of the previous iteration's address, which the kernel makes itself."""
    found = _rotation(values, values.info, back, entry, lambda value: _outside(values, value))
    if found is None:
        return False
    values.rotations[arg] = found
    return True


def task_rotation(values: LoopValues, loop: LoopInfo, arg: Value, back: Value, entry: Value) -> bool:
    """Record header argument ``arg`` of ``loop``, a child loop of the candidate, as a
    rotated load of its tasks (``LoopValues.task_rotations``), on the terms of
    :func:`rotated_load` in ``loop``: its address affine in ``loop``'s counter and the
    candidate's, the entry's load made in the block that enters ``loop`` inside the
    candidate's body. A wavefront (:func:`.fission.split_wavefront`) reloads it at the top
    of each task where no store of the task's own iteration writes that address."""
    found = _rotation(values, loop, back, entry, values.expr) or _stored_rotation(values, loop, back, entry)
    if found is None:
        return False
    values.task_rotations[arg] = (loop, *found)
    return True


def _rotation(
    values: LoopValues, loop: LoopInfo, back: Value, entry: Value, before: Callable[[Value], Poly | None]
) -> tuple[Op, Poly] | None:
    """(The load, its address) where ``back`` and ``entry`` make header argument a rotation
    of ``loop`` (:func:`rotated_load`); ``before`` gives the entry's address as a polynomial."""
    load, first = back.owner, entry.owner
    facts = values.facts
    if not (
        isinstance(load, Op)
        and load.name == "mem.load"
        and isinstance(first, Op)
        and first.name == "mem.load"
    ):
        return None
    inside = facts.bodies[loop]
    if (
        load.block not in inside
        or any(load.block in facts.bodies[m] for m in values.nested if m is not loop and m.header in inside)
        or (load.attrs["bits"], load.attrs["signed"]) != (first.attrs["bits"], first.attrs["signed"])
        or (load.results[0].type is not first.results[0].type)
    ):
        return None
    k = values.counter(loop)
    around = {values.counter(values.info)} if loop is not values.info else set()
    address = values.expr(load.operands[0])
    if (
        address is None
        or address.leaves() & (set(values.counters.values()) - {k} - around)
        or address.floors()  # (the kernel computes the reload's address as a polynomial)
    ):
        return None
    split = address.split(k)
    if split is None or split[1].leaves() & ({k} | around):
        return None
    if not _entered_with(values, loop, first):
        return None
    symbols = dict(values.symbols)
    at = before(first.operands[0])
    if at is None or at + Poly.const(first.attrs["offset"]) != split[0] - split[1] + Poly.const(
        load.attrs["offset"]
    ):
        values.symbols = symbols
        return None
    return load, address


def _entered_with(values: LoopValues, loop: LoopInfo, first: Op) -> bool:
    """``first`` is made in the block that enters ``loop``, with nothing after it there that
    writes memory."""
    preheader = next(p for p in values.facts.preds[loop.header] if p not in values.facts.bodies[loop])
    return first.block is preheader and not any(
        _writes(op) for op in preheader.ops[preheader.ops.index(first) + 1 : -1]
    )


def _writes(op: Op) -> bool:
    """``op`` may change memory (a load, pure arithmetic and branches do not)."""
    return not (op.opdef.pure or op.opdef.terminator or op.name == "mem.load")


def _stored_rotation(values: LoopValues, loop: LoopInfo, back: Value, entry: Value) -> tuple[Op, Poly] | None:
    """(A store, its address) where the back edge of ``loop`` (a child loop of the
    candidate) passes the value its iteration stored last at one address ``S`` affine in
    the counters (``t``: nussinov's ``table[i][j]``, the next ``j``'s ``table[i][j - 1]``),
    on every path, nothing after it that may write ``S``; and the loop is entered with a load
    of the same width at ``S(-1)`` (:func:`_entered_with`). Memory then holds the value at
    the next iteration's start, which may load it again. A forward pass over the loop's body
    finds the value last stored at ``S`` at each block, through merges that pass it on
    (inner loops' headers assumed to, then checked at their back edges)."""
    first = entry.owner
    if not (isinstance(first, Op) and first.name == "mem.load" and first.results[0].type is back.type):
        return None
    if first.attrs["bits"] != back.type.bits or not _entered_with(values, loop, first):
        return None
    facts = values.facts
    inside = facts.bodies[loop]
    own = [m for m in values.nested if m is not loop and m.header in inside]
    k = values.counter(loop)
    around = {values.counter(values.info), k}
    before = values.expr(first.operands[0])
    if before is None:
        return None
    stores = [op for b in facts.in_order(inside) for op in b.ops if op.name == "mem.store"]
    for store in stores:
        if any(store.block in facts.bodies[m] for m in own) or store.attrs["bits"] != back.type.bits:
            continue
        address = _address(values, store)
        if address is None or address.leaves() & (set(values.counters.values()) - around):
            continue
        split = address.split(k)
        if split is None or split[1].leaves() & around or not split[1] or address.floors():
            continue
        if before + Poly.const(first.attrs["offset"]) != split[0] - split[1]:
            continue
        if _last_stored(values, loop, address, back):
            return store, address - Poly.const(store.attrs["offset"])
    return None


def _address(values: LoopValues, op: Op) -> Poly | None:
    at = values.expr(op.operands[0])
    return None if at is None else at + Poly.const(op.attrs["offset"])


def _last_stored(values: LoopValues, loop: LoopInfo, address: Poly, back: Value) -> bool:
    """Whether every path through an iteration of ``loop`` ends with ``back`` the value
    last stored at ``address`` (full width), nothing after it that may write there."""
    facts = values.facts
    inside = facts.bodies[loop]
    order = facts.in_order(inside)
    TOP = object()  # not reached yet
    state: dict = {b: TOP for b in order}
    state[loop.header] = None
    end: dict = {}
    for _ in range(2 * len(order) + 2):  # (a block goes from unreached to a value to none)
        changed = False
        for block in order:
            here = state[block] if block is loop.header else _merged(facts, block, end, inside, TOP)
            state[block] = out = here
            if here is TOP:
                continue
            for op in block.ops:
                if op.name == "mem.store":
                    at = _address(values, op)
                    if at is not None and at == address and op.attrs["bits"] == op.operands[1].type.bits:
                        out = op.operands[1]
                    elif not _apart(at, address, op.attrs["bits"] // 8):
                        out = None
                elif _writes(op):
                    out = None
            if end.get(block, TOP) is not out:
                end[block] = out
                changed = True
        if not changed:
            return all(end.get(latch) is back for latch in facts.latches[loop])
    return False  # (no fixed point reached: nothing proven)


def _merged(facts, block: Block, end: dict, inside: set, top: object) -> object:
    """The value last stored at a block's start: what every reached edge into it carries,
    as the block's argument it passes it in, or the same value on every edge."""
    found = top
    for pred in facts.preds[block]:
        if pred not in inside:
            return None
        value = end.get(pred, top)
        if value is top:
            continue
        if value is None:
            return None
        passed = [
            block.args[n] for op in pred.ops for succ in op.successors if succ.block is block
            for n, v in enumerate(succ.args) if v is value
        ]  # fmt: skip
        here = passed[0] if passed else value
        if found is not top and found is not here:
            return None
        found = here
    return found


def _apart(at: Poly | None, address: Poly, width: int) -> bool:
    """Two accesses of ``width`` bytes at ``at`` and ``address`` never overlap: they differ
    by a constant of at least the width."""
    if at is None:
        return False
    gap = at - address
    return gap.is_constant() and abs(gap.constant) >= width


def reload_access(values: LoopValues, loop: LoopInfo, load: Op, address: Poly) -> Access:
    """The reload of a rotation of ``loop`` at the start of an iteration: the previous
    iteration's address (the entry value's for the first), read before any store of the
    iteration, as one address with no offset (the first one's operand may be below zero)."""
    k = values.counter(loop)
    rest, step = address.split(k)
    previous = rest + step * (Poly.symbol(k) - Poly.const(1)) + Poly.const(load.attrs["offset"])
    return Access(load, False, load.attrs["bits"] // 8, previous, 0, frozenset())


def _outside(values: LoopValues, value: Value) -> Poly | None:
    """A value computed before the loop as a polynomial of the values the loop's entry
    holds (the symbols the body's polynomials use), through add, sub, mul and shl by a
    constant; None otherwise."""
    owner = value.owner
    if isinstance(owner, Op) and owner.name == "arith.constant" and not owner.attrs["type"].is_float:
        bits, width = owner.attrs["value"], owner.attrs["type"].bits
        return Poly.const(bits - (1 << width) if bits >> (width - 1) else bits)
    if any(e is value for e in values.info.entry_env):
        return Poly.symbol(values.symbol_for(value))
    if not (isinstance(owner, Op) and owner.name in ("arith.add", "arith.sub", "arith.mul", "arith.shl")):
        return None
    a, b = (_outside(values, v) for v in owner.operands)
    if a is None or b is None:
        return None
    if owner.name == "arith.shl":
        return a.scale(1 << (b.constant & (value.type.bits - 1))) if b.is_constant() else None
    return {"arith.add": a + b, "arith.sub": a - b, "arith.mul": a * b}[owner.name]
