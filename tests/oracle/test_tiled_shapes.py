"""The loops family's ``rows`` shape (``oracle.generators._rows``): gemv's row per thread and
gemm's cell per thread, with an inner loop the tiler stages in shared memory
(``compiler/tile.py``). Drawn kernels are tiled, run as wasmtime runs them, and a tile that
stages the step after the one it runs is found by the fuzzer and shrunk to one kernel."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tensorwasm.compiler import tile
from tensorwasm.compiler.prepare import prepare_offload
from tensorwasm.oracle.generators import _loop_module
from tests.oracle.test_polybench_shapes import _draws, _planted_is_found


def test_drawn_rows_and_cells_are_tiled() -> None:
    """``rows``: the ``i`` loop's 1-D kernel is tiled 16 rows a block of 128 threads. ``cells``: the
    2-D grid over ``(i, j)`` is tiled 16 x 16 threads a block, and the ``j`` loop's own
    kernel (launched where the ``i`` loop declines) is not: ``d[k][j]`` walks down a
    column, which neighbouring threads read at neighbouring addresses already."""
    seen: Counter = Counter()
    for kernel in _draws("rows"):
        preparation = prepare_offload(_loop_module([kernel]).wasm)
        variant = kernel[3]["variant"]
        for lp in preparation.prepared.loops:
            if lp.plan.loop.depth > 1:  # cells' j loop; either's k loop (a reduction, some drawn)
                assert lp.tile is None
                continue
            assert bool(lp.plan.collapse) == (variant == "cells")
            seen[variant] += 1
            if variant == "rows":
                assert lp.tile == (16, 1, 1, 96)
            else:
                assert lp.tile is not None and lp.tile[2:] == (16, 16)
    assert seen["rows"] >= 8 and seen["cells"] >= 8, seen


def test_a_tile_staging_the_next_step_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stage that loads, for each of its steps, what the loop reads one step later: the
    cells' sums then take the wrong operands (the last step, which the cells' own code
    runs, aside), on the simulated device."""
    _planted_is_found(monkeypatch, "rows", tile.TileBuilder, "stage_loads", "m = self.add(b, m0, mm)",
                      "m = self.add(b, m0, self.add(b, mm, b.constant(I32, 1)))", "offload-sim", tmp_path)  # fmt: skip
