"""Byte ranges of linear memory: what a launch reads and writes, what a device holds."""

from __future__ import annotations

from bisect import bisect_left, bisect_right


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


class Rows:
    """``count`` rows of ``width`` bytes, ``pitch`` bytes apart, the first at ``lo``: the
    elements a launch touches in a column, or in the rows' tails, of a row-major matrix
    (gramschmidt's column of Q: 1,000 elements of 8 bytes spread over 9.6 MB). Copied as
    one 2-D copy instead of the whole range that holds them."""

    __slots__ = ("count", "lo", "pitch", "width")

    def __init__(self, lo: int, width: int, pitch: int, count: int) -> None:
        self.lo, self.width, self.pitch, self.count = lo, width, pitch, count

    @property
    def hi(self) -> int:
        return self.lo + self.pitch * (self.count - 1) + self.width

    @property
    def nbytes(self) -> int:
        return self.width * self.count

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Rows:
            return NotImplemented
        return (self.lo, self.width, self.pitch, self.count) == (other.lo, other.width, other.pitch, other.count)

    def __hash__(self) -> int:
        return hash((self.lo, self.width, self.pitch, self.count))

    def __repr__(self) -> str:
        return f"Rows(lo={self.lo}, width={self.width}, pitch={self.pitch}, count={self.count})"


def each_row(copy, dst: int, src: int, pitch: int, width: int, count: int) -> None:
    """``count`` rows of ``width`` bytes, ``pitch`` bytes apart, from ``src`` to ``dst``, one
    ``copy(dst, src, nbytes)`` a row: :class:`Rows` where no 2-D copy can take them."""
    for at in range(0, pitch * count, pitch):
        copy(dst + at, src + at, width)


def union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint ranges covering ``a`` and ``b`` (touching ranges merge)."""
    merged: list[list[int]] = []
    for lo, hi in sorted(r for r in a + b if r[1] > r[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


class SpanSet:
    """Sorted, disjoint byte ranges (touching ones merged) that grow and shrink a few ranges
    at a time: what a device holds inside a device-resident region. Kept as two lists, the
    starts and the ends, so that adding, removing or looking up a range costs a binary
    search and a splice of the lists, not a sort of the whole set (symm's region gathers a
    thousand separate ranges, one more with each launch)."""

    __slots__ = ("his", "los")

    def __init__(self, ranges=()) -> None:
        self.los: list[int] = []
        self.his: list[int] = []
        self.add(ranges)

    def __bool__(self) -> bool:
        return bool(self.los)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.los, self.his, strict=True))

    def __repr__(self) -> str:
        return f"SpanSet({self.ranges()})"

    def add(self, ranges) -> None:
        """Cover ``ranges`` ((lo, hi) pairs) too."""
        los, his = self.los, self.his
        for lo, hi in ranges:
            if hi <= lo:
                continue
            first = bisect_left(his, lo)  # the first range ending at or past lo: it meets or touches
            last = bisect_right(los, hi, first)  # past the last range starting at or before hi
            if first < last:
                lo = min(lo, los[first])
                hi = max(hi, his[last - 1])
            los[first:last] = [lo]
            his[first:last] = [hi]

    def remove(self, ranges) -> None:
        """Cover nothing of ``ranges`` any more."""
        los, his = self.los, self.his
        for lo, hi in ranges:
            if hi <= lo:
                continue
            first = bisect_right(his, lo)  # the first range ending past lo
            last = bisect_left(los, hi, first)  # past the last range starting before hi
            if first >= last:
                continue
            keep_lo = [los[first]] if los[first] < lo else []
            keep_hi = [lo] if keep_lo else []
            if his[last - 1] > hi:
                keep_lo.append(hi)
                keep_hi.append(his[last - 1])
            los[first:last] = keep_lo
            his[first:last] = keep_hi

    def outside(self, ranges) -> list[tuple[int, int]]:
        """The parts of ``ranges`` this set does not cover, sorted and disjoint."""
        out = []
        for lo, hi, held in self._meeting(ranges):
            for held_lo, held_hi in held:
                if held_lo > lo:
                    out.append((lo, held_lo))
                lo = held_hi
            if lo < hi:
                out.append((lo, hi))
        return out

    def inside(self, ranges) -> list[tuple[int, int]]:
        """The parts of ``ranges`` this set covers, sorted and disjoint."""
        return [
            (max(lo, held_lo), min(hi, held_hi))
            for lo, hi, held in self._meeting(ranges)
            for held_lo, held_hi in held
        ]

    def _meeting(self, ranges):
        """Per range of ``ranges`` (merged, in order): its (lo, hi) and the ranges of the set
        that meet it, in order."""
        los, his = self.los, self.his
        for lo, hi in union(list(ranges), []):
            first = bisect_right(his, lo)  # the first range ending past lo
            last = bisect_left(los, hi, first)  # past the last range starting before hi
            yield lo, hi, zip(los[first:last], his[first:last], strict=True)
