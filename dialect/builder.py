"""Building ops into blocks, with the types checked as each op is made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorwasm.dialect import cf
from tensorwasm.dialect.arith import constant
from tensorwasm.dialect.ir import Block, Function, Op, Successor, Value
from tensorwasm.dialect.opdef import OpDef
from tensorwasm.dialect.types import Type
from tensorwasm.support.errors import IRTypeError


class Builder:
    """Appends ops to the current block of a function.

    ``offset`` is stamped on every op built, so a frontend sets it once per source
    instruction and later errors can name where an op came from.
    """

    __slots__ = ("block", "func", "offset")

    def __init__(self, func: Function, block: Block | None = None):
        self.func = func
        self.block = block
        self.offset: int | None = None

    def op(
        self,
        opdef: OpDef,
        operands: Sequence[Value] = (),
        attrs: dict[str, Any] | None = None,
        successors: list[Successor] | None = None,
    ) -> Op:
        """Build ``opdef`` on ``operands``; raises IRTypeError naming both types on a mismatch."""
        attrs = attrs if attrs is not None else {}
        result_types = opdef.infer([v.type for v in operands], attrs)
        if successors:
            for succ in successors:
                check_successor(opdef, succ)
        op = Op(opdef, list(operands), result_types, attrs, successors, self.offset)
        op.block = self.block
        self.block.ops.append(op)
        return op

    def value(self, opdef: OpDef, *operands: Value, **attrs: Any) -> Value:
        """Build a one-result op and return its result."""
        return self.op(opdef, operands, attrs).results[0]

    def constant(self, type: Type, value: int) -> Value:
        """A constant given by its bit pattern (negative ints are wrapped to the width)."""
        return self.op(constant, (), {"type": type, "value": value & ((1 << type.bits) - 1)}).results[0]

    def br(self, target: Block, args: Sequence[Value] = ()) -> Op:
        return self.op(cf.br, (), None, [Successor(target, list(args))])

    def cond_br(
        self,
        cond: Value,
        then: Block,
        then_args: Sequence[Value],
        other: Block,
        other_args: Sequence[Value],
    ) -> Op:
        succs = [Successor(then, list(then_args)), Successor(other, list(other_args))]
        return self.op(cf.cond_br, (cond,), None, succs)

    def ret(self, values: Sequence[Value]) -> Op:
        return self.op(cf.return_, values)

    def trap(self, kind: str) -> Op:
        return self.op(cf.trap, (), {"kind": kind})


def check_successor(opdef: OpDef, succ: Successor) -> None:
    """Check that a branch passes values of the target block's argument types."""
    params = succ.block.args
    if len(params) != len(succ.args):
        raise IRTypeError(f"{opdef.name}: target block takes {len(params)} argument(s), got {len(succ.args)}")
    for param, arg in zip(params, succ.args, strict=True):
        if param.type is not arg.type:
            raise IRTypeError(f"{opdef.name}: cannot pass {arg.type} to a {param.type} block argument")
