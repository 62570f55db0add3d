"""Reduction recognition: a loop-carried value the iterations may combine in any order.

A header argument of the candidate loop, with one back edge, is a reduction when its
update on that edge is

- a chain of one associative operation from the argument (``add``, ``mul``, ``and``,
  ``or``, ``xor``, ``fadd``, ``fmul``: the dialect op of a :class:`ReductionKind` row;
  unrolled loops apply it several times per iteration), each link used once and the
  argument read only by the chain; or
- a chain of ``select(cmp(prev, x), prev, x)`` links, each compare ordering the two values
  it selects between: a minimum or a maximum, signed or unsigned by the compare;

and the running value is read inside the loop only to carry it to the next iteration (a
prefix sum stores it, which makes every iteration depend on the one before). A float
kind reorders roundings, so it is a reduction only under relaxed float semantics; without
them the loop is rejected with that reason.

A vectorised loop carries a ``v128`` accumulator combined by one lane-wise integer
operation (``i32x4.add``, ``v128.xor``, ``i16x8.min_s``: :data:`VECTOR_KINDS`); each lane is
then a reduction of its own, exact in any order, and the kernel returns one partial result
per lane (:func:`lane_reductions`), which the rewritten module folds into the vector with
that same operation. A float vector accumulator (``f32x4.add``) would be reordered lane by
lane, so the loop stays on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject, at
from tensorwasm.compiler.analysis.plan import Reduction, ReductionKind
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.analysis.trips import SWAP
from tensorwasm.dialect import arith, simd
from tensorwasm.dialect.ir import Block, Op, Value

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues

# The kinds recognised as chains of one dialect op, by that op.
BY_DIALECT_OP = {kind.traits.dialect_op: kind for kind in ReductionKind if not kind.traits.compare}
# The min/max kinds, by the compare that keeps the earlier value and its signedness.
BY_COMPARE = {
    (kind.traits.compare, kind.traits.signed): kind for kind in ReductionKind if kind.traits.compare
}
# The lane-wise SIMD operations a vector accumulator may be combined with, and the kind of
# the reduction each of its lanes then carries (bitwise ones take the vector as i64x2 lanes).
VECTOR_KINDS: dict[str, ReductionKind] = {
    **{f"{shape}.add": ReductionKind.ADD for shape in ("i8x16", "i16x8", "i32x4", "i64x2")},
    **{f"{shape}.mul": ReductionKind.MUL for shape in ("i16x8", "i32x4", "i64x2")},
    **{f"{shape}.{name}": kind for shape in ("i8x16", "i16x8", "i32x4")
       for name, kind in (("min_s", ReductionKind.MIN_S), ("min_u", ReductionKind.MIN_U),
                          ("max_s", ReductionKind.MAX_S), ("max_u", ReductionKind.MAX_U))},
    "v128.and": ReductionKind.AND, "v128.or": ReductionKind.OR, "v128.xor": ReductionKind.XOR,
}  # fmt: skip


def recognise_reduction(values: LoopValues, arg: Value, update: Value, body: set[Block]) -> Reduction | None:
    """The reduction that header argument ``arg`` carries (``update``: its value on the back
    edge), or None; :class:`Reject` for a float one without relaxed float semantics."""
    op = update.owner
    if not isinstance(op, Op):
        return None
    users = values.facts.users
    def_block = values.facts.def_block
    uses = [u for u, b in users.get(arg, []) if b in body]
    if op.name == "simd.binary":
        return _vector_reduction(values, arg, update, body)
    if op.name in BY_DIALECT_OP:
        # A chain of the same associative op from the argument to the update (unrolled
        # loops add twice per iteration), each link used once.
        link = op
        while arg not in link.operands:
            inner = [v for v in link.operands if isinstance(v.owner, Op) and v.owner.name == op.name
                     and def_block[v] in body and len(users.get(v, [])) == 1]  # fmt: skip
            if len(inner) != 1:
                return None
            link = inner[0].owner
        if len(uses) != 1 or not _only_carried(values, update, body):
            return None
        kind = BY_DIALECT_OP[op.name]
        if kind.is_float and not values.options.relaxed_float:
            raise Reject(f"float reduction ({op.name} at {at(op)}) needs --relaxed-float")
        return Reduction(arg, kind, update)
    if op.name == "arith.select":
        # min/max: select(cmp(prev, x), prev, x) links, unrolled loops chain several.
        kinds = set()
        value = update
        while value is not arg:
            link = _minmax_link(values, value, arg, body)
            if link is None:
                return None
            kind, value = link
            kinds.add(kind)
        if len(kinds) != 1 or len(uses) != 2 or not _only_carried(values, update, body):
            return None
        return Reduction(arg, kinds.pop(), update)
    return None


def _vector_reduction(values: LoopValues, arg: Value, update: Value, body: set[Block]) -> Reduction | None:
    """A v128 accumulator combined by one lane-wise integer operation (a chain of it from
    ``arg``, each link used once, as for scalars), or None; :class:`Reject` for a float one."""
    op = update.owner
    name = op.attrs["op"]
    if name.startswith("f") and name.split(".", 1)[1] in ("add", "mul", "min", "max", "pmin", "pmax"):
        raise Reject(f"float vector reduction ({name} at {at(op)}) would reorder the lanes' roundings")
    kind = VECTOR_KINDS.get(name)
    if kind is None:
        return None
    users = values.facts.users
    link = op
    while arg not in link.operands:
        inner = [v for v in link.operands if isinstance(v.owner, Op) and v.owner.attrs.get("op") == name
                 and values.facts.def_block[v] in body and len(users.get(v, [])) == 1]  # fmt: skip
        if len(inner) != 1:
            return None
        link = inner[0].owner
    uses = [u for u, b in users.get(arg, []) if b in body]
    if len(uses) != 1 or not _only_carried(values, update, body):
        return None
    return Reduction(arg, kind, update, lanes=name)


def lane_shape(lanes: str) -> str:
    """The lane shape a vector reduction's lanes are read in: its operation's, or i64x2 for
    a bitwise one."""
    shape = lanes.split(".", 1)[0]
    return "i64x2" if shape == "v128" else shape


def lane_identity(kind: ReductionKind, bits: int) -> int:
    """The identity of ``kind`` over lanes of ``bits`` bits, as the kernel's lane value holds
    it: 64-bit lanes as they are, narrower ones extended to 32 bits as they are read (signed
    for a signed min/max, else zero-extended)."""
    if bits >= 32:
        return kind.identity(bits)
    if kind is ReductionKind.MIN_S:
        return (1 << (bits - 1)) - 1
    if kind is ReductionKind.MAX_S:
        return (-(1 << (bits - 1))) & 0xFFFFFFFF
    return kind.identity(32) & ((1 << bits) - 1)


def lane_reductions(vector: Reduction) -> list[Reduction]:
    """One scalar reduction per lane of the v128 reduction ``vector``: its argument and
    update are the lane read out of the vector's (ops of no block: the outliner reads the
    lane in the kernel), its initial value the identity (the rewritten module folds the
    lanes' results into the vector's value at loop entry)."""
    shape = lane_shape(vector.lanes)
    count, bits, scalar = simd.SHAPES[shape]
    extract = f"{shape}.extract_lane" + ("" if bits >= 32 else "_s" if vector.op.traits.signed else "_u")
    identity = Poly.const(lane_identity(vector.op, bits))

    def lane_of(value: Value, lane: int) -> Value:
        return Op(simd.extract_lane, [value], (scalar,), {"op": extract, "lane": lane}).results[0]

    return [
        Reduction(lane_of(vector.arg, lane), vector.op, lane_of(vector.update, lane), vector.local, identity,
                  lanes=vector.lanes, lane=lane, vector=vector.arg)
        for lane in range(count)
    ]  # fmt: skip


def init_bits(values: LoopValues, value: Value) -> Poly:
    """A float reduction's entry value, as its bits: a constant, or a live-in symbol."""
    owner = value.owner
    if isinstance(owner, Op) and owner.opdef is arith.constant:
        return Poly.const(owner.attrs["value"])
    return Poly.symbol(values.symbol_for(value))


def _only_carried(values: LoopValues, update: Value, body: set[Block]) -> bool:
    """The running value is not read inside the loop except to carry it on: a prefix sum
    stores it, which makes every iteration depend on the one before."""
    inside = [op for op, b in values.facts.users.get(update, []) if b in body]
    return all(op.opdef.terminator and update not in op.operands for op in inside)


def _minmax_link(
    values: LoopValues, value: Value, arg: Value, body: set[Block]
) -> tuple[ReductionKind, Value] | None:
    """The min/max kind of the select defining ``value``, and the running value it selects
    from (``arg`` itself or the previous link of an unrolled chain)."""
    op = value.owner
    if not isinstance(op, Op) or op.name != "arith.select":
        return None
    cond, a, b = op.operands
    cmp = cond.owner
    if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
        return None
    if {id(v) for v in cmp.operands} != {id(a), id(b)}:  # it compares the two values it selects
        return None
    for prev in (a, b):
        is_link = prev is arg or (
            isinstance(prev.owner, Op) and prev.owner.name == "arith.select"
            and values.facts.def_block[prev] in body and len(values.facts.users.get(prev, [])) == 2
        )  # fmt: skip
        if not is_link:
            continue
        pred = cmp.attrs["pred"] if cmp.operands[0] is prev else SWAP[cmp.attrs["pred"]]
        if pred in ("eq", "ne"):
            return None
        less = pred in ("slt", "sle", "ult", "ule")
        keeps_smaller = less == (a is prev)
        return BY_COMPARE[("<" if keeps_smaller else ">", pred.startswith("s"))], prev
    return None
