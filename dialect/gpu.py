"""The ``gpu`` dialect: the thread's place in the launch grid, barriers, and shared memory.

The outliner uses these to turn a loop's induction variable into a thread index; the
host backend lowers them too, as loop counters of its own launch loop.

Shared memory is a set of arrays a function declares in its ``shared`` attribute (name ->
(element type, element count)); ``gpu.shared_load`` and ``gpu.shared_store`` index one by
element. On the GPU an array is block-shared (PTX ``.shared``, LLVM address space 3); on
the host, where a tiled kernel runs with one thread per block, it is the function's own.
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import NUMBERS, Custom, Dialect, Fixed
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


def _shared_load(op, operands, attrs):
    op.expect_count(operands, 1)
    if operands[0] is not I32:
        raise op.fail(f"the element index must be i32, got {operands[0]}")
    if not isinstance(attrs.get("array"), str) or attrs.get("type") not in NUMBERS:
        raise op.fail("needs an array name and a number type")
    return (attrs["type"],)


def _shared_store(op, operands, attrs):
    op.expect_count(operands, 2)
    if operands[0] is not I32:
        raise op.fail(f"the element index must be i32, got {operands[0]}")
    if not isinstance(attrs.get("array"), str) or operands[1] not in NUMBERS:
        raise op.fail("needs an array name and a number to store")
    return ()


def _issued(op, operands, attrs):
    if not operands or any(t not in NUMBERS for t in operands):
        raise op.fail("needs one or more numbers")
    return ()


def _prefetch(op, operands, attrs):
    op.expect_count(operands, 1)
    if operands[0] is not I32:
        raise op.fail(f"the address must be i32, got {operands[0]}")
    if not isinstance(attrs.get("offset"), int) or attrs["offset"] < 0:
        raise op.fail("needs a non-negative offset")
    return ()


barrier = Fixed("gpu.barrier", "`gpu.barrier`: every thread of the block waits here.", (), ())
barrier_or = Fixed(
    "gpu.barrier_or",
    "`%1 = gpu.barrier_or %0 : i32`: a barrier that also gives 1 to every thread of the block "
    "if any thread passed a non-zero value, else 0 (PTX bar.red.or).",
    (I32,),
    (I32,),
)
shared_load = Custom(
    "gpu.shared_load",
    "`%1 = gpu.shared_load %0 {array = a0, type = f32}`: element %0 of shared array a0.",
    _shared_load,
)
shared_store = Custom(
    "gpu.shared_store",
    "`gpu.shared_store %0, %1 {array = a0}`: element %0 of shared array a0 becomes %1.",
    _shared_store,
)

issued = Custom(
    "gpu.issued",
    "`gpu.issued %0, %1`: %0 and %1 are computed before this point (loads among them are "
    "issued here, and may still be in flight after it); it emits no instruction.",
    _issued,
)

prefetch = Custom(
    "gpu.prefetch",
    "`gpu.prefetch %0 {offset = 0}`: a hint to bring the 128-byte line of linear memory at "
    "%0 + offset into the L2 cache (PTX prefetch.global.L2); nothing where that is outside "
    "memory, and nothing on the host.",
    _prefetch,
)

GPU = Dialect(
    "gpu",
    [
        thread_id,
        block_id,
        block_dim,
        grid_dim,
        barrier,
        barrier_or,
        shared_load,
        shared_store,
        issued,
        prefetch,
    ],
)
