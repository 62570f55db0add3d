"""The ``gpu`` dialect: the thread's place in the launch grid, and barriers.

The outliner uses these to turn a loop's induction variable into a thread index; the
host backend lowers them too, as loop counters of its own launch loop.
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import Custom, Dialect, Fixed
from tensorwasm.dialect.types import I32


def _dim(op, operands, attrs):
    op.expect_count(operands, 0)
    if attrs.get("dim") not in ("x", "y", "z"):
        raise op.fail(f"dimension must be x, y or z, got {attrs.get('dim')!r}")
    return (I32,)


thread_id = Custom("gpu.thread_id", "`%0 = gpu.thread_id {dim = x}` (PTX %tid.x)", _dim, pure=True)
block_id = Custom("gpu.block_id", "`%0 = gpu.block_id {dim = y}` (PTX %ctaid.y)", _dim, pure=True)
block_dim = Custom("gpu.block_dim", "`%0 = gpu.block_dim {dim = x}` (PTX %ntid.x)", _dim, pure=True)
grid_dim = Custom("gpu.grid_dim", "`%0 = gpu.grid_dim {dim = x}` (PTX %nctaid.x)", _dim, pure=True)
barrier = Fixed("gpu.barrier", "`gpu.barrier`: every thread of the block waits here.", (), ())

GPU = Dialect("gpu", [thread_id, block_id, block_dim, grid_dim, barrier])
