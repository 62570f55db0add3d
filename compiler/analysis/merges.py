"""Merges chosen by tests: a block argument whose incoming values are different polynomials.

clang -O2 starts a loop from a value that depends on which way a loop-invariant test went:
the scalar remainder after a vectorised loop starts at 1 when the row is too short for the
vector loop (``if ((m - 2) <u 4)``) and where the vector loop stopped otherwise
(``((m - 2) & -4) | 1``); a loop with one step peeled when ``(1 - i) & 1`` is set starts at
``i + 1`` then and at ``i`` otherwise. Such a merge is one polynomial when one can be shown
equal, modulo 2^bits, to the value each incoming edge passes, under the tests that edge is
known to pass (its own branch and those up a chain of blocks of one predecessor each):

- one of the incoming values itself, when every other edge's value equals it wherever that
  edge is taken (the vector loop's end is 1 when the row is too short for it);
- ``a + t * (b - a)`` for a test ``t == 0`` (value ``a``) / ``t != 0`` (value ``b``), where
  ``t`` may take only the values 0 and 1 (``x & 1``): a piecewise value as a quasi-affine one.

Each equality is proven with isl (:func:`.isl.equal_where`) on the values as Wasm computes
them, wrapping included; anything not proven leaves the merge unknown, and the loops that
depend on it keep their reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.isl import equal_where
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.analysis.trips import NEGATE, _aside, _through_boolean_tests, incoming
from tensorwasm.dialect.ir import Op, Value

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues

# How far up a chain of single-predecessor blocks an edge's tests are read.
_MAX_TESTS = 8

# (predicate, lhs, rhs, bits, the compare's operands): the compare holds. The operands are
# read without making symbols (a test alone must not add live-ins to the kernel); a formula
# that uses one reads it again for good.
Test = tuple[str, Poly, Poly, int, list[Value]]


def selected_merge(values: LoopValues, value: Value) -> Poly | None:
    """The merge ``value`` (a block argument, not a loop header's) as one polynomial proven
    equal to every incoming value where its edge is taken, or None."""
    facts, block = values.facts, value.owner
    edges = incoming(facts, value)
    if len(edges) < 2 or not hasattr(value.type, "bits") or value.type.is_float:
        return None
    arms = [values.expr(w) for _, w in edges]
    if any(p is None for p in arms):
        return None
    tests = [edge_tests(values, pred, block) for pred, _ in edges]
    bits = value.type.bits
    return _proven(values, arms, tests, bits)


def select_value(values: LoopValues, op: Op) -> Poly | None:
    """``arith.select c, a, b`` as one polynomial, as for a merge of two edges whose tests
    are ``c`` and its negation."""
    cond, a, b = op.operands
    arms = [values.expr(a), values.expr(b)]
    if any(p is None for p in arms) or op.results[0].type.is_float:
        return None
    test = _test_of(values, cond)
    tests = [[test] if test else [], [_negated(test)] if test else []]
    bits = op.results[0].type.bits
    return _proven(values, arms, tests, bits)


def _proven(values: LoopValues, arms: list[Poly], tests: list[list[Test]], bits: int) -> Poly | None:
    """The first candidate formula proven equal to each arm under its edge's tests, or None.
    The proof reads live-ins through the code that computed them before the loop (the
    vector loop's end and the row length it was computed from are two live-ins)."""
    wide = values.unbounded
    opened = [[(pred, _opened(wide, x), _opened(wide, y), w) for pred, x, y, w, _ in t] for t in tests]
    for formula in _candidates(values, arms, tests):
        whole = _opened(wide, formula)
        if all(
            p == formula or equal_where(t, _opened(wide, p), whole, bits)
            for p, t in zip(arms, opened, strict=True)
        ):
            return formula
    return None


def _opened(wide: LoopValues, poly: Poly) -> Poly:
    """``poly`` with each live-in replaced by the polynomial of the code computing it, where
    there is one (congruent modulo 2^bits: what a proof on wrapped values needs)."""
    total = Poly()
    for monomial, coeff in poly.terms.items():
        term = Poly.const(coeff)
        for sym in monomial:
            if sym.kind == "floor":
                inner, divisor = sym.ref
                term = term * wide.floor_of(_opened(wide, inner), divisor)
                continue
            found = wide.expr(sym.ref) if sym.kind == "value" else None
            term = term * (found if found is not None else Poly.symbol(sym))
        total = total + term
    return total


def _candidates(values: LoopValues, arms: list[Poly], tests: list[list[Test]]) -> list[Poly]:
    """The formulas worth proving: each distinct incoming value, then for two edges tested
    ``t == 0`` and ``t != 0`` against each other, ``a + t * (b - a)``."""
    out = []
    for p in arms:
        if p not in out:
            out.append(p)
    if len(arms) == 2:
        for zero, other in ((0, 1), (1, 0)):
            for pred, lhs, rhs, _, operands in tests[zero][:1]:
                side = 0 if rhs == Poly.const(0) else 1 if lhs == Poly.const(0) else None
                tested = values.expr(operands[side]) if pred == "eq" and side is not None else None
                if tested is not None:
                    out.append(arms[zero] + tested * (arms[other] - arms[zero]))
    return out


def edge_tests(values: LoopValues, pred, block) -> list[Test]:
    """The compares known to hold when control goes from ``pred`` to ``block``: ``pred``'s
    own branch, then the branches up a chain of blocks of one predecessor each, nearest
    first (a test whose operands are not polynomials is left out: fewer facts, still true)."""
    facts = values.facts
    out: list[Test] = []
    target = block
    while len(out) < _MAX_TESTS:
        term = pred.terminator
        if term.name == "cf.cond_br" and term.successors[0].block is not term.successors[1].block:
            cmp = term.operands[0].owner
            if isinstance(cmp, Op) and cmp.name == "arith.cmpi":
                cmp, negated = _through_boolean_tests(cmp)
                holds = (term.successors[0].block is target) != negated
                operands = _aside(values, cmp.operands)
                if None not in operands:
                    predicate = cmp.attrs["pred"] if holds else NEGATE[cmp.attrs["pred"]]
                    out.append((predicate, *operands, cmp.operands[0].type.bits, cmp.operands))
        if len(facts.preds[pred]) != 1 or facts.preds[pred][0] not in values.body:
            break
        target, pred = pred, facts.preds[pred][0]
    return out


def _test_of(values: LoopValues, cond: Value) -> Test | None:
    """The compare ``cond`` as a test that holds, or None where it is not modelled."""
    cmp = cond.owner
    if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
        return None
    cmp, negated = _through_boolean_tests(cmp)
    operands = _aside(values, cmp.operands)
    if None in operands:
        return None
    predicate = NEGATE[cmp.attrs["pred"]] if negated else cmp.attrs["pred"]
    return (predicate, *operands, cmp.operands[0].type.bits, cmp.operands)


def _negated(test: Test) -> Test:
    return (NEGATE[test[0]], *test[1:])
