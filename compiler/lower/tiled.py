"""Launch entries of tiled loop kernels (:mod:`compiler.tile`).

A tiled kernel keeps its loop kernel's entry signature, so the runtime launches it as any
2-D nest (or 1-D loop); only the launch shape differs (``TiledKernel.gpu_shape``: a block per
tile of ``rows x cols`` cells). GPU: ``tw_kernel_<index>(ctx, params, trip, trip2, out)``
(``trip2`` absent for a 1-D kernel: one column), each block walking the tiles
``(blockIdx.y + k * gridDim.y, blockIdx.x + l * gridDim.x)``. Every
thread of a block calls the tile function for the same tiles (its barriers need the whole
block), so a thread whose cell trapped goes on with the block; the trap code reaches the
context at the end. Host: ``tw_loop_<index>(ctx, params, begin, end, trip2, out)``, the
rows ``[begin, end)`` a tile of rows at a time, stopping at the first trap.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.env import i64_const
from tensorwasm.compiler.lower.types import I32_T, I64_T

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import ModuleLowering
    from tensorwasm.compiler.tile import TiledKernel


def launch_bounds(module: ir.Module, fn: ir.Function, block: tuple[int, int, int], blocks: int) -> None:
    """Tell ptxas the block every launch of ``fn`` uses and the blocks per multiprocessor to
    fit (PTX ``.maxntid`` and ``.minnctapersm``): it then caps the registers per thread
    at what that many blocks leave, spilling where it must."""
    i32 = ir.IntType(32)
    for key, value in (*zip(("maxntidx", "maxntidy", "maxntidz"), block, strict=True), ("minctasm", blocks)):
        module.add_named_metadata(
            "nvvm.annotations", [fn, ir.MetaDataString(module, key), ir.Constant(i32, value)]
        )


def lower_tiled_entry(lowering: ModuleLowering, index: int, tiled: TiledKernel) -> str:
    """The launch entry of loop kernel ``index`` running its tiled variant for the target."""
    from tensorwasm.compiler.lower.function import (
        FunctionLowering,
        _live_in_args,
        _read_sreg,
        _report_trap,
        _slot,
        counted_loop,
        entry_frame,
    )

    gpu = lowering.target.is_gpu
    kernel = lowering.dialect.functions[index]
    tile_index = tiled.gpu_index if gpu else tiled.host_index
    shape = tiled.gpu_shape if gpu else tiled.host_shape
    FunctionLowering(lowering, lowering.dialect.functions[tile_index]).lower()
    dims = 1 + len(kernel.attrs["loop_plan"].collapse)
    frame = entry_frame(lowering, index, dims)
    fn, b, ctx, slots, begin, own = frame.fn, frame.b, frame.ctx, frame.slots, frame.begin, frame.own
    if gpu:
        launch_bounds(lowering.llvm, fn, (shape.threads_x, shape.launch_y, 1), tiled.gpu_blocks)
    trip, trip2 = frame.bounds if dims == 2 else (*frame.bounds, i64_const(1))
    args = _live_in_args(b, kernel, slots, dims)
    tile = lowering.function_for(tile_index)
    done = fn.append_basic_block("done")

    counted = functools.partial(counted_loop, b, fn)

    def call(i0, j0) -> None:
        i32 = functools.partial(b.trunc, typ=I32_T)
        b.call(tile, [own, i32(i0), i32(j0), i32(trip), i32(trip2), *args])
        if not gpu:  # the host stops at a trap; a GPU block goes on together
            trapped = b.icmp_unsigned("!=", b.load(_slot(b, own, abi.CTX_TRAP), typ=I64_T), i64_const(0))
            cont = fn.append_basic_block("next")
            b.cbranch(trapped, done, cont)
            b.position_at_end(cont)

    rows, cols = i64_const(shape.rows), i64_const(shape.cols)
    if gpu:
        sreg = functools.partial(_read_sreg, lowering.llvm, b)
        tiles_y = b.udiv(b.add(trip, i64_const(shape.rows - 1)), rows)
        tiles_x = b.udiv(b.add(trip2, i64_const(shape.cols - 1)), cols)

        def over_rows(by) -> None:
            after = fn.append_basic_block("row.done")
            counted(
                sreg("ctaid.x"),
                sreg("nctaid.x"),
                tiles_x,
                after,
                lambda bx: call(b.mul(by, rows), b.mul(bx, cols)),
            )
            b.position_at_end(after)

        counted(sreg("ctaid.y"), sreg("nctaid.y"), tiles_y, done, over_rows)
    else:

        def over_host_rows(i0) -> None:
            after = fn.append_basic_block("row.done")
            counted(i64_const(0), cols, trip2, after, lambda j0: call(i0, j0))
            b.position_at_end(after)

        counted(begin, rows, trip, done, over_host_rows)
    b.position_at_end(done)
    _report_trap(b, own, ctx)
    b.ret_void()
    return fn.name
