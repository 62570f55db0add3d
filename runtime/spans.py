"""Byte ranges of linear memory: what a launch reads and writes, what a device holds."""

from __future__ import annotations


class Span:
    """The byte range ``[lo, hi)`` of linear memory (immutable, compared and hashed by value;
    a plain class: a warm start imports no dataclasses)."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a Span is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Span:
            return NotImplemented
        return self.lo == other.lo and self.hi == other.hi

    def __hash__(self) -> int:
        return hash((self.lo, self.hi))

    def __repr__(self) -> str:
        return f"Span(lo={self.lo}, hi={self.hi})"

    def __reduce__(self):
        return (Span, (self.lo, self.hi))


def union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint ranges covering ``a`` and ``b`` (touching ranges merge)."""
    merged: list[list[int]] = []
    for lo, hi in sorted(r for r in a + b if r[1] > r[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``a`` outside the sorted, disjoint ranges ``b``."""
    out = []
    for lo, hi in union(a, []):
        for blo, bhi in b:
            if bhi <= lo or blo >= hi:
                continue
            if blo > lo:
                out.append((lo, blo))
            lo = max(lo, bhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out
