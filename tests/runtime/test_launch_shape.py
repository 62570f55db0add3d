"""The launch shapes the planner gives loop kernels (the grid and block of a GPU launch)."""

from __future__ import annotations

from tensorwasm.runtime.guards import Launch
from tensorwasm.runtime.planning import BLOCK_THREADS, REDUCTION_BLOCKS, launch_grid


def test_a_reduction_kernel_runs_one_wave_of_blocks_that_stride() -> None:
    """A reduction's blocks each end in a tree and an atomic per result: its grid stops at
    one wave of resident blocks however long the loop, where a loop without reductions
    gets a block per 256 iterations (up to the grid's limit)."""
    long = Launch(1 << 25, {}, [], [])
    assert launch_grid(long, None, 3) == ((REDUCTION_BLOCKS, 1, 1), (BLOCK_THREADS, 1, 1))
    assert launch_grid(long) == ((65535, 1, 1), (BLOCK_THREADS, 1, 1))
    short = Launch(1000, {}, [], [])  # fewer iterations than the cap: a block per 256
    assert launch_grid(short, None, 1) == ((4, 1, 1), (BLOCK_THREADS, 1, 1))
    assert REDUCTION_BLOCKS * BLOCK_THREADS < (1 << 25)
