"""The launch shapes the planner gives loop kernels (the grid and block of a GPU launch)."""

from __future__ import annotations

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions
from tensorwasm.compiler.rewrite import HOST_MODULE
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.guards import Launch
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import BLOCK_THREADS, REDUCTION_BLOCKS, launch_grid
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat


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


# sum of n i32 from address 0 (memory: 64 pages, the first 64 KiB a pattern).
SUM = """(module (memory (export "memory") 64)
  (func (export "total") (param $n i32) (result i32) (local $i i32) (local $s i32)
    (loop $l
      (local.set $s (i32.add (local.get $s) (i32.load (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $s))
  (data (i32.const 0) "%s"))"""


@pytest.mark.gpu
def test_a_folds_grid_on_the_gpu_is_one_wave_of_the_blocks_its_kernel_fits(monkeypatch) -> None:
    """A 1-D reduction over 2^20 iterations: its grid is what the device holds at once of
    its kernel's blocks (the driver's occupancy calculator, times the multiprocessors),
    not a second, partial wave; and its sum is wasmtime's."""
    from tensorwasm.runtime import mirror

    launched = []
    original = mirror.DeviceMirror.launch

    def spy(self, key, base, copies, upload, kernel, grid, block, *rest):
        launched.append((kernel, grid, block))
        return original(self, key, base, copies, upload, kernel, grid, block, *rest)

    monkeypatch.setattr(mirror.DeviceMirror, "launch", spy)
    pattern = "".join(f"\\{(i * 37 + 11) % 256:02x}" for i in range(65536))
    data = wat(SUM % pattern)
    offload = OffloadModule(data, device="gpu", mode="always", options=AnalysisOptions())
    instance = ReferenceInstance(
        offload.rewritten,
        lambda store: {(HOST_MODULE, name): f for name, f in offload.host_functions(store).items()},
    )
    args = [(I32, 1 << 20)]
    assert instance.call("total", args) == ReferenceInstance(data).call("total", args)
    ((kernel, grid, block),) = launched
    wave = kernel.blocks_per_multiprocessor(block[0]) * offload.backend.context.info.multiprocessor_count
    assert grid == (min(wave, REDUCTION_BLOCKS), 1, 1) and block == (BLOCK_THREADS, 1, 1)
    offload.close()
