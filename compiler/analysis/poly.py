"""Integer polynomials over symbols: the algebra of addresses and trip counts.

A :class:`Poly` maps monomials (sorted tuples of symbols) to integer coefficients. Symbols
are loop-invariant values (the loop's live-ins), globals read in the loop, and the
iteration counters of loops. Wasm's i32 arithmetic wraps; a polynomial computes the
unwrapped value, which equals the wrapped one whenever it lies in [0, 2^32) (addition and
multiplication commute with reduction modulo 2^32), so the runtime guards check exactly
that before trusting a polynomial.

A symbol of kind "floor" is the quasi-affine value ``floor(inner / d)`` of a polynomial
``inner`` and a power of two ``d`` (``ref`` is ``(inner, d)``): clang's unrolled loops bound
themselves by ``n & -4``, which is ``4 * floor(n / 4)``, and their remainders by ``n & 3``,
``n - 4 * floor(n / 4)``. Both are exact modulo 2^32 for every integer ``n`` congruent to the
i32 value (``d`` divides 2^32), so they keep the rule above. A floor symbol evaluates itself
from its inner polynomial; :meth:`Poly.leaves` looks through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

_ids = itertools.count()


class Symbol:
    """A named unknown: ``kind`` is "value" (a live-in SSA value), "global" or "counter"."""

    __slots__ = ("kind", "name", "order", "ref")

    def __init__(self, kind: str, ref, name: str):
        self.kind = kind
        self.ref = ref
        self.name = name
        self.order = next(_ids)

    def __repr__(self) -> str:
        return self.name

    @staticmethod
    def floor(inner: Poly, divisor: int) -> Symbol:
        """The symbol of ``floor(inner / divisor)`` (callers intern it: one object per value)."""
        return Symbol("floor", (inner, divisor), f"floor(({inner}) / {divisor})")

    def leaves(self) -> set[Symbol]:
        """This symbol, or for a floor symbol the symbols of its inner polynomial."""
        return self.ref[0].leaves() if self.kind == "floor" else {self}


Monomial = tuple[Symbol, ...]


class Poly:
    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int] | None = None):
        self.terms: dict[Monomial, int] = {m: c for m, c in (terms or {}).items() if c}

    @staticmethod
    def const(value: int) -> Poly:
        return Poly({(): value})

    @staticmethod
    def symbol(sym: Symbol) -> Poly:
        return Poly({(sym,): 1})

    def __add__(self, other: Poly) -> Poly:
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Poly(terms)

    def __neg__(self) -> Poly:
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Poly) -> Poly:
        return self + (-other)

    def __mul__(self, other: Poly) -> Poly:
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2, key=lambda s: s.order))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Poly(terms)

    def scale(self, factor: int) -> Poly:
        return Poly({m: c * factor for m, c in self.terms.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(frozenset(self.terms.items()))

    @property
    def constant(self) -> int:
        return self.terms.get((), 0)

    def is_constant(self) -> bool:
        return all(not m for m in self.terms)

    def symbols(self) -> set[Symbol]:
        return {s for m in self.terms for s in m}

    def uses(self, sym: Symbol) -> bool:
        return any(sym in m for m in self.terms)

    def leaves(self) -> set[Symbol]:
        """Every symbol the value depends on, through floor symbols (never one of those)."""
        out: set[Symbol] = set()
        for sym in self.symbols():
            out |= sym.leaves()
        return out

    def floors(self) -> set[Symbol]:
        """The floor symbols of the polynomial (not those nested inside them)."""
        return {s for s in self.symbols() if s.kind == "floor"}

    def split(self, counter: Symbol) -> tuple[Poly, Poly] | None:
        """(rest, coefficient) with self = rest + coefficient * counter; None if the counter
        appears squared or the coefficient still holds it."""
        rest: dict[Monomial, int] = {}
        coeff: dict[Monomial, int] = {}
        for m, c in self.terms.items():
            n = m.count(counter)
            if n == 0:
                rest[m] = c
            elif n == 1:
                coeff[tuple(s for s in m if s is not counter)] = c
            else:
                return None
        return Poly(rest), Poly(coeff)

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        total = 0
        for m, c in self.terms.items():
            term = c
            for s in m:
                if s.kind == "floor" and s not in env:
                    inner, divisor = s.ref
                    term *= inner.evaluate(env) // divisor
                else:
                    term *= env[s]
            total += term
        return total

    def __repr__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (len(mc[0]), [s.order for s in mc[0]])):
            names = "*".join(s.name for s in m)
            if not m:
                parts.append(str(c))
            elif c == 1:
                parts.append(names)
            elif c == -1:
                parts.append(f"-{names}")
            else:
                parts.append(f"{c}*{names}")
        return " + ".join(parts).replace("+ -", "- ")
