"""Op definitions: what an op is called, which operands it takes, what it yields.

An :class:`OpDef` is a declaration, not a node: ops in a function point at their
definition. ``infer`` checks operand types and attributes and returns the result types;
the builder calls it while building and the verifier calls it again, so an op with the
wrong types cannot exist in a verified function. The shared bases below cover the
families that have one shape (integer binaries, float unaries, casts...), so each dialect
file is a list of short declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tensorwasm.dialect.types import F32, F64, I1, I32, I64, Type
from tensorwasm.support.errors import IRTypeError

INTS = (I32, I64)
FLOATS = (F32, F64)
NUMBERS = (I32, I64, F32, F64)


class OpDef:
    """Base op definition. ``doc`` carries a worked example in the printed syntax."""

    terminator = False
    # Ops without side effects may be removed when unused, or hoisted, by later stages.
    pure = True

    def __init__(self, name: str, doc: str):
        self.name = name
        self.doc = doc
        self.dialect = name.split(".", 1)[0]

    def infer(self, operands: Sequence[Type], attrs: dict[str, Any]) -> tuple[Type, ...]:
        raise NotImplementedError

    def __reduce__(self) -> tuple:
        """Pickled by name: the definitions are module-level singletons."""
        return (op_by_name, (self.name,))

    def fail(self, message: str) -> IRTypeError:
        return IRTypeError(f"{self.name}: {message}")

    def expect_count(self, operands: Sequence[Type], count: int) -> None:
        if len(operands) != count:
            raise self.fail(f"takes {count} operand(s), got {len(operands)}")

    def __repr__(self) -> str:
        return f"<OpDef {self.name}>"


def _types(types: Sequence[Type]) -> str:
    return ", ".join(t.name for t in types)


class Uniform(OpDef):
    """``arity`` operands of one type from ``allowed``, one result of that type."""

    def __init__(self, name: str, doc: str, allowed: tuple[Type, ...], arity: int):
        super().__init__(name, doc)
        self.allowed = allowed
        self.arity = arity

    def infer(self, operands, attrs):
        self.expect_count(operands, self.arity)
        first = operands[0]
        if first not in self.allowed:
            raise self.fail(f"operand type {first} is not one of {_types(self.allowed)}")
        for other in operands[1:]:
            if other is not first:
                raise self.fail(f"operand types {first} and {other} differ")
        return (first,)


class IntBinary(Uniform):
    def __init__(self, name: str, doc: str):
        super().__init__(name, doc, INTS, 2)


class IntUnary(Uniform):
    def __init__(self, name: str, doc: str):
        super().__init__(name, doc, INTS, 1)


class FloatBinary(Uniform):
    def __init__(self, name: str, doc: str):
        super().__init__(name, doc, FLOATS, 2)


class FloatUnary(Uniform):
    def __init__(self, name: str, doc: str):
        super().__init__(name, doc, FLOATS, 1)


class Trapping(OpDef):
    """Mixin marker: the op may trap, so it must not be removed or speculated."""

    pure = False


class TrappingIntBinary(Trapping, IntBinary):
    pass


class Compare(OpDef):
    """Two operands of one type compared under ``attrs["pred"]``, giving an ``i1``."""

    def __init__(self, name: str, doc: str, allowed: tuple[Type, ...], predicates: tuple[str, ...]):
        super().__init__(name, doc)
        self.allowed = allowed
        self.predicates = predicates

    def infer(self, operands, attrs):
        self.expect_count(operands, 2)
        lhs, rhs = operands
        if lhs not in self.allowed or rhs is not lhs:
            raise self.fail(f"cannot compare {lhs} with {rhs}")
        if attrs.get("pred") not in self.predicates:
            raise self.fail(f"unknown predicate {attrs.get('pred')!r}")
        return (I1,)


class Cast(OpDef):
    """One operand converted to ``attrs["to"]``; ``legal(src, dst)`` says which pairs exist."""

    def __init__(self, name: str, doc: str, legal: Callable[[Type, Type], bool], *, traps=False):
        super().__init__(name, doc)
        self.legal = legal
        self.pure = not traps

    def infer(self, operands, attrs):
        self.expect_count(operands, 1)
        src, dst = operands[0], attrs.get("to")
        if not isinstance(dst, Type) or not self.legal(src, dst):
            raise self.fail(f"cannot convert {src} to {dst}")
        return (dst,)


class Fixed(OpDef):
    """Fixed operand and result types, for ops whose signature never varies."""

    def __init__(
        self,
        name: str,
        doc: str,
        operands: tuple[Type, ...],
        results: tuple[Type, ...],
        *,
        pure: bool = False,
        terminator: bool = False,
    ):
        super().__init__(name, doc)
        self.operand_types = operands
        self.result_types = results
        self.pure = pure
        self.terminator = terminator

    def infer(self, operands, attrs):
        if tuple(operands) != self.operand_types:
            raise self.fail(f"expects operands ({_types(self.operand_types)}), got ({_types(operands)})")
        return self.result_types


class Custom(OpDef):
    """An op whose typing rule is a function ``rule(opdef, operands, attrs)``."""

    def __init__(self, name: str, doc: str, rule, *, pure=False, terminator=False):
        super().__init__(name, doc)
        self.rule = rule
        self.pure = pure
        self.terminator = terminator

    def infer(self, operands, attrs):
        return self.rule(self, operands, attrs)


def op_by_name(name: str) -> OpDef:
    """The definition of the op ``name`` (e.g. ``"arith.add"``)."""
    from tensorwasm.dialect import OPS

    return OPS[name]


class Dialect:
    """A named group of op definitions, looked up by full op name."""

    def __init__(self, name: str, ops: Sequence[OpDef]):
        self.name = name
        self.ops = {op.name: op for op in ops}
        for op in ops:
            if op.dialect != name:
                raise ValueError(f"{op.name} does not belong to dialect {name}")
