"""The runtime's overlap tests against brute force over every pair of iterations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.guards import Range, _conflict2


def footprint(r: Range, o: int, i: int) -> tuple[int, int]:
    start = r.base + r.stride * o + r.stride2 * i
    return start, start + r.width


def brute_force(s: Range, a: Range, trip: int, trip2: int) -> bool:
    cells = [(o, i) for o in range(trip) for i in range(trip2)]
    for p in cells:
        s_lo, s_hi = footprint(s, *p)
        for q in cells:
            a_lo, a_hi = footprint(a, *q)
            if p != q and s_lo < a_hi and a_lo < s_hi:
                return True
    return False


def grid_range(base: int, stride: int, stride2: int, width: int, trip: int, trip2: int) -> Range:
    corners = [base + stride * o + stride2 * i for o in (0, trip - 1) for i in (0, trip2 - 1)]
    return Range(min(corners), max(corners) + width, base, stride, width, stride2)


strides = st.sampled_from([0, 4, 8, -4, 12, 16, 36, 40])


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 6), st.integers(1, 6), strides, strides, st.integers(-48, 48),
    st.sampled_from([4, 8]), st.sampled_from([4, 8, 16]), st.booleans(),
)  # fmt: skip
def test_2d_conflict_test_is_exact_for_equal_strides(trip, trip2, so, si, d, ws, wa, same) -> None:
    s = grid_range(1000, so, si, ws, trip, trip2)
    a = (
        grid_range(1000 - d, so, si, wa, trip, trip2)
        if same
        else grid_range(1000 - d, si, so, wa, trip, trip2)
    )
    found = _conflict2(s, a, trip, trip2)
    truth = brute_force(s, a, trip, trip2)
    if (s.stride, s.stride2) == (a.stride, a.stride2):
        assert found == truth
    else:
        assert found or not truth  # conservative: never misses a conflict


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 9), strides, st.integers(-48, 48), st.sampled_from([1, 4, 8]), st.sampled_from([1, 4, 16])
)
def test_1d_conflict_test_is_exact_for_equal_strides(trip, stride, d, ws, wa) -> None:
    from runtime.guards import _conflict

    s = grid_range(1000, stride, 0, ws, trip, 1)
    a = grid_range(1000 - d, stride, 0, wa, trip, 1)
    assert _conflict(s, a, trip) == brute_force(s, a, trip, 1)
