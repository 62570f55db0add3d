"""The block of a 2-D or 3-D nest's launch: up to 8 rows of a warp each (32 x 8, the block
nvcc's stencils launch), so that a block's rows share their neighbours' cache lines and a
row of the innermost counter wastes less than a warp."""

from __future__ import annotations

from tensorwasm.runtime.guards import Launch
from tensorwasm.runtime.planning import BLOCK_THREADS, NEST_ROWS, launch_grid


def _nest(trip: int, *nest: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return launch_grid(Launch(trip, {}, [], [], nest=nest))


def test_a_wide_2d_nest_gets_blocks_of_32_by_8() -> None:
    """The suite's stencil2d at n = 4096: 4094 x 4094 cells, 128 x 512 blocks of 32 x 8
    (where a block of 256 x 1 read each row above and below from L2 alone)."""
    assert NEST_ROWS == 8
    assert _nest(4094, 4094) == ((128, 512, 1), (32, 8, 1))


def test_a_3d_nest_wastes_less_than_a_warp_a_row() -> None:
    """The suite's stencil3d at n = 384: rows of 382 cells take 12 warps (384 threads),
    where two blocks of 256 ran 512 threads for them; z covers the outermost counter."""
    grid, block = _nest(382, 382, 382)
    assert block == (32, 8, 1)
    assert grid == (12, 48, 382)
    assert grid[0] * block[0] - 382 < 32


def test_a_nest_of_few_rows_gets_as_few_rows_a_block() -> None:
    """Fewer rows than 8: a block of as many (rounded to a power of two), each as wide as
    the 256 threads allow; one row keeps the one-row block of before."""
    assert _nest(3, 1000) == ((16, 1, 1), (64, 4, 1))
    assert _nest(1, 100) == ((1, 1, 1), (128, 1, 1))
    assert _nest(1, 5000) == ((20, 1, 1), (BLOCK_THREADS, 1, 1))
    assert _nest(2, 7, 9) == ((1, 1, 2), (32, 8, 1))
    for trip in (0, 1, 2, 5, 8, 9, 70000):
        for inner in (1, 31, 33, 5000):
            grid, block = _nest(trip, inner)
            assert block[0] * block[1] <= BLOCK_THREADS and block[0] % 32 == 0
            assert grid[1] <= 65535 and grid[0] <= 65535
            # every cell has a thread, or the y grid stops at its limit and threads stride
            assert grid[0] * block[0] >= inner
            assert grid[1] * block[1] >= trip or grid[1] == 65535
