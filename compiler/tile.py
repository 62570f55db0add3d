"""Exact shared-memory tiling of gemm-shaped loop kernels.

A 2-D loop kernel (:mod:`compiler.outline`: one thread per cell ``(i, j)``) whose thread
runs one sequential inner loop ``k`` reading rows and columns, as gemm does
(``C[i][j] = sum_k A[i][k] * B[k][j]``), re-reads every element of ``A`` and ``B`` once
per cell. The tiled kernel computes a tile of ``rows x cols`` cells per thread block, a
register block of cells per thread, and stages what the inner loop reads in shared
memory, ``depth`` iterations at a time. Wasm fixes every sum's order and forbids fused
multiply-add, so nothing here reorders arithmetic: tiling changes only where the inner
loop's loads read from and which thread computes which cell.

Each cell runs its own code, copied from the kernel, in three phases:

1. *Prefix*: the code before the inner loop, which must be pure (arithmetic and proven
   loads). It either enters the loop, giving the loop's entry values, or goes around it.
2. *Engine*: the loop body, its ops copied as they are, run for every cell of the thread
   in lock step with the block. Each load of the body is a *staged* load: its address
   depends on one grid counter only (``A[i][k]``: a row load, ``B[k][j]``: a column load)
   and on the loop's induction variables, whose value at iteration ``m`` is
   ``start + step * m`` (:attr:`LoopPlan.ivs`). The block loads ``depth`` iterations of
   each into shared memory, and each iteration reads them from there. A cell commits
   iteration ``m`` only when the loop's own exit test says the loop goes on after it, so
   the engine never runs an iteration the loop would not, nor the last one.
3. *Resume*: the cell's code from the start again (the prefix is pure, so it takes the
   same path), entering the loop at the iteration the engine reached with the engine's
   carried values; the loop's own code runs what is left (at least its last iteration)
   and everything after it: the store of ``C[i][j]``, any scaling, traps.

Staging reads ahead of the loop (rows past the grid, iterations past the last): those
loads are ``speculative`` (never a trap; outside linear memory they read what address 0
holds), and their values reach no cell that commits. The tile shape comes from a small
model of the device (:func:`choose_tile`). The host backend runs the same construction
with one thread per block (:data:`HOST_SHAPE`), so the CPU tests check its exactness.

A 1-D kernel whose thread runs such a loop along a row (gemv: ``y[i] = sum_k A[i][k] *
x[k]``) reads, at each iteration, elements a row apart in neighbouring threads: every load
of a warp touches as many memory lines as it has threads. Tiled as a grid of one column
(:func:`row_shape`), a block stages ``depth`` iterations of its rows with neighbouring
threads reading neighbouring elements of a row, and the loads that follow no row
(``x[k]``) once for the block; each thread then runs its row's iterations from shared
memory in the row's order. Its block has more threads than rows (:attr:`TileShape.block_y`):
all of them load each stage, and those past the rows leave the computing to the others. On
the GPU a row tile issues the loads of the next stage while it computes this one (held in
registers: :attr:`TileShape.prefetch`), and hints its row's lines further ahead into the
L2 cache (:data:`L2_AHEAD`). Only loads that walk their row by a constant stride are staged
so: a load that moves down a column as the loop runs (``A[k][i]``) is already read by
neighbouring threads at neighbouring addresses, and the kernel keeps its plain form.
"""

from __future__ import annotations

from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.prepare import TRAPPING_OPS
from tensorwasm.compiler.stream import attach_streaming
from tensorwasm.dialect import arith, gpu, mem
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Block, Function, Module, Op, Successor, Value
from tensorwasm.dialect.opdef import NUMBERS
from tensorwasm.dialect.types import I1, I32, Type
from tensorwasm.dialect.verifier import reverse_postorder, verify_function
from tensorwasm.support import config
from tensorwasm.support.records import record


@record(frozen=True)
class DeviceModel:
    """What :func:`choose_tile` knows of the GPU: the defaults hold on every target
    (sm_75, sm_80, sm_90)."""

    shared_bytes: int = 48 * 1024  # static shared memory one block may declare
    registers_per_sm: int = 65536  # 32-bit registers of one multiprocessor
    max_registers_per_thread: int = 255
    max_threads_per_sm: int = 1024  # sm_75's limit, the smallest of the targets


@record(frozen=True)
class TileShape:
    """A block of ``threads_y x threads_x`` threads, each computing ``cells_y x cells_x``
    cells, strided (a thread's cells are ``threads_y`` rows and ``threads_x`` columns
    apart, so neighbouring threads touch neighbouring elements); ``depth`` loop
    iterations are staged in shared memory at a time."""

    threads_x: int
    threads_y: int
    cells_x: int
    cells_y: int
    depth: int
    # On the GPU, each stage's global loads are issued a stage ahead, into registers, and
    # are in flight while the block computes the stage before (see TileBuilder.engine).
    prefetch: bool = False
    # Threads the block has down, where more than ``threads_y``: those past ``threads_y``
    # hold no cell (a row tile: ROW_THREADS threads for ROW_CELLS rows).
    block_y: int = 0
    # Where above 0: the threads from this one on (flat index) only stage, and those
    # before it only compute (the first ``threads`` of them hold the cells), a stage ahead
    # of them in a second shared buffer (see TileBuilder.split).
    stage_from: int = 0

    @property
    def threads(self) -> int:
        return self.threads_x * self.threads_y

    @property
    def launch_y(self) -> int:
        """Threads the block has down, the staging-only ones included."""
        return max(self.threads_y, self.block_y)

    @property
    def block_threads(self) -> int:
        """Threads the block has, the staging-only ones included: they share each stage."""
        return self.threads_x * self.launch_y

    @property
    def rows(self) -> int:
        return self.threads_y * self.cells_y

    @property
    def cols(self) -> int:
        return self.threads_x * self.cells_x

    def shared_bytes(self, row_bytes: int, col_bytes: int) -> int:
        """Shared memory for ``row_bytes`` of row loads and ``col_bytes`` of column loads
        per iteration (row arrays padded by one element against bank conflicts), in two
        buffers where some threads only stage (``stage_from``)."""
        buffers = 2 if self.stage_from else 1
        return buffers * self.depth * ((self.rows + 1) * row_bytes + self.cols * col_bytes)


HOST_SHAPE = TileShape(1, 1, 4, 4, 16)  # the host backend: one thread per block
# 1-D kernels (:func:`row_shape`): a block of ROW_THREADS threads of which the first warp
# computes (its first ROW_CELLS threads run a row each) and the other two stage, ``depth``
# iterations of each row a stage, one stage ahead of it (ROW_STAGE_FROM); the host runs
# four rows a tile. A warp that stages its rows alone spends most of each stage on its
# loads' addresses. gemv on an H200 at n = 2048 / 4096 / 8192, kernel us, all threads
# staging and a full stage's loop rolled: 32 rows in one warp 58.8 / 115.7 / 236, 16 rows
# in four warps 43.6 / 86.5 / 185; unrolled (MAX_UNROLL): 32 rows in four warps 32.7 / 61.9
# / 134, 16 in four warps 28.7 / 56.7 / 126.3. A warp that only computes and others that
# only stage, in two buffers: 16 rows and four staging warps 21.5 / 43.7 / 156 (a second
# wave: three blocks a multiprocessor), two 21.1 / 45.2 / 106.9, one 36.8 / 74.6 / 152;
# 32 rows and two 34.4 / 70.4 / 149.7.
ROW_THREADS = 96
ROW_CELLS = 16
ROW_STAGE_FROM = 32  # the first warp computes (its first ROW_CELLS threads), the other two stage
ROW_HOST_SHAPE = TileShape(1, 1, 1, 4, 16)
# Bytes of each row a stage reads: 256, two 128-byte lines. 512 was faster at n = 2048 and
# 4096 (28.1 and 53.5 us) but not at 8192 (204 us: the blocks' registers no longer fit one wave).
ROW_STAGE_BYTES = 256
MAX_ROW_DEPTH = 128
_CANDIDATES = tuple(
    TileShape(16, 16, cx, cy, depth)
    for cx, cy in ((4, 4), (4, 2), (2, 2), (2, 1), (1, 1))
    for depth in (16, 8)
)


@record(frozen=True)
class TiledKernel:
    """The tiled variants of a loop kernel: function indices and shapes, GPU and host, and
    the blocks per multiprocessor the GPU kernel's launch bounds ask for
    (:func:`resident_blocks`)."""

    gpu_index: int
    gpu_shape: TileShape
    host_index: int
    host_shape: TileShape
    gpu_blocks: int = 1


def estimated_registers(shape: TileShape, carried_words: int, row_loads: int, col_loads: int) -> int:
    """32-bit registers a thread of ``shape`` needs: the carried values and iteration
    count of each cell, the staged values of one iteration, and a fixed allowance for
    addresses, counters and the loop's own temporaries."""
    cells = shape.cells_x * shape.cells_y
    return cells * (carried_words + 1) + shape.cells_y * row_loads + shape.cells_x * col_loads + 40


def choose_tile(
    row_bytes: int,
    col_bytes: int,
    carried_words: int,
    loads: tuple[int, int],
    model: DeviceModel | None = None,
) -> TileShape | None:
    """The tile for a nest whose loop reads ``row_bytes`` (row loads) and ``col_bytes``
    (column loads) per iteration and carries ``carried_words`` 32-bit words per cell;
    ``loads`` counts its (row, column) loads.

    A candidate fits when its shared memory is within ``model.shared_bytes``, its
    registers (:func:`estimated_registers`) within the per-thread limit, and one block's
    registers within a multiprocessor's. Among those that keep at least a quarter of the
    multiprocessor's threads busy, the largest register block wins (each staged element
    is reused by more cells), then the deeper stage (fewer barriers); None where none fits.
    """
    model = model or DeviceModel()
    best = None
    for shape in _CANDIDATES:
        regs = estimated_registers(shape, carried_words, *loads)
        if shape.shared_bytes(row_bytes, col_bytes) > model.shared_bytes:
            continue
        if regs > model.max_registers_per_thread or regs * shape.threads > model.registers_per_sm:
            continue
        blocks = min(
            model.registers_per_sm // (regs * shape.threads),
            model.shared_bytes * 2 // max(1, shape.shared_bytes(row_bytes, col_bytes)),
            model.max_threads_per_sm // shape.threads,
        )
        if blocks * shape.threads * 4 < model.max_threads_per_sm:
            continue
        key = (shape.cells_x * shape.cells_y, shape.depth)
        if best is None or key > best[0]:
            best = (key, shape)
    return best[1] if best else None


def row_shape(
    row_stride: int, row_bytes: int, col_bytes: int, model: DeviceModel | None = None
) -> TileShape | None:
    """The tile of a 1-D kernel whose rows advance ``row_stride`` bytes an iteration (the
    widest of its row loads' strides) and whose loop reads ``row_bytes`` (row loads) and
    ``col_bytes`` (loads that follow no row) an iteration: :data:`ROW_CELLS` rows of one
    thread each of a warp that computes, in a block of :data:`ROW_THREADS` threads whose
    others stage (:data:`ROW_STAGE_FROM`), and as many iterations a stage as
    :data:`ROW_STAGE_BYTES` of a row hold (a power of two from 32 to :data:`MAX_ROW_DEPTH`:
    see :meth:`TileBuilder.stage_layout`), fewer where the model's shared memory asks; None
    where not even 32 fit."""
    model = model or DeviceModel()
    fit = max(1, ROW_STAGE_BYTES // max(1, row_stride))
    depth = min(MAX_ROW_DEPTH, max(32, 1 << (fit.bit_length() - 1)))  # (a power of two: see stage_layout)
    while depth >= 32:
        shape = TileShape(
            1, ROW_CELLS, 1, 1, depth, prefetch=True, block_y=ROW_THREADS, stage_from=ROW_STAGE_FROM
        )
        if shape.shared_bytes(row_bytes, col_bytes) <= model.shared_bytes:
            return shape
        depth //= 2
    return None


# A row tile's prefetch hints run this many stages ahead of the stage being computed (its
# loads run one ahead, into registers): a warp's stage takes about as long as a load from
# memory, so the lines are in the L2 cache by the time the loads ask for them. A hint is one
# per 128-byte line (LINE_BYTES) of each row load.
L2_AHEAD = 3
LINE_BYTES = 128

# A full stage's loop runs up to MAX_UNROLL iterations a trip, as long as the copies of the
# loop body (one per cell of the thread) stay within UNROLLED_OPS ops (TileBuilder.fast_unroll).
MAX_UNROLL = 8
UNROLLED_OPS = 128

# Blocks per multiprocessor a tiled kernel asks for. With one, the multiprocessor idles
# while its block stages the next tile (global loads, then a barrier); with two, one block
# computes while the other loads. ptxas meets the request by capping each thread's
# registers (65536 / (2 * 256) = 128 for a 16 x 16 block).
RESIDENT_BLOCKS = 2


def resident_blocks(
    shape: TileShape, shared_bytes: int, registers: int, model: DeviceModel | None = None
) -> int:
    """The most blocks of ``shape`` (up to :data:`RESIDENT_BLOCKS`) that fit one
    multiprocessor by the model's threads and shared memory, with ``shared_bytes`` of shared
    memory per block and the register cap that the count sets still at or above the
    ``registers`` estimated per thread (:func:`estimated_registers`)."""
    model = model or DeviceModel()
    for blocks in range(RESIDENT_BLOCKS, 1, -1):
        threads = blocks * shape.block_threads
        if (
            threads <= model.max_threads_per_sm
            and blocks * shared_bytes <= 2 * model.shared_bytes
            and registers <= min(model.registers_per_sm // threads, model.max_registers_per_thread)
        ):
            return blocks
    return 1


# Each cell of a thread runs its own copy of the kernel's code before and after the loop:
# a larger kernel keeps one thread per cell rather than grow the code by the cell count.
MAX_KERNEL_OPS = 400


class NotTileable(Exception):
    """Why a nest keeps its one-thread-per-cell kernel (its message says)."""


@record
class Nest:
    """A recognised gemm-shaped kernel: its inner loop ``header`` (one block), the
    induction variables among its arguments (index -> (start, step)), the loads of its
    body by the grid counter their address follows (``"i"``, ``"j"``), the blocks before
    the loop, and which successor of the header's branch goes round again."""

    kernel: Function
    plan: LoopPlan
    header: Block
    ivs: dict[int, tuple[Poly, Poly]]
    loads: list[tuple[Op, str]]
    prefix: list[Block]
    back: int
    # Float values pass only through ops under which a NaN reaches the carried values or
    # vanishes (see _nan_checked): the engine then runs the arithmetic without Wasm's NaN
    # rules and redoes a tile the exact way where a carried value came out NaN.
    nan_checked: bool = False
    # The loop's exit test reads no value of a cell (only induction variables that start
    # alike in every cell, and live-ins): a thread can tell a full stage ahead of it.
    uniform_exit: bool = False
    # The grid's dimensions: 2 (cells (i, j)), or 1 (rows i; its "j" loads follow no counter).
    dims: int = 2
    # A 1-D nest: the bytes each load's address advances an iteration (0 for a load that
    # follows no row).
    strides: tuple[int, ...] = ()

    @property
    def row_stride(self) -> int:
        """A 1-D nest: the most bytes a row load's address advances an iteration."""
        return max(self.strides, default=0)

    @property
    def carried(self) -> list[int]:
        """The header arguments that are not induction variables (the accumulators)."""
        return [p for p in range(len(self.header.args)) if p not in self.ivs]


def tile_kernel(
    module: Module,
    kernel: Function,
    plan: LoopPlan,
    clones: dict[Block, Block],
    accesses: dict[int, int],
) -> None:
    """Attach tiled variants to the outlined ``kernel`` (``kernel.attrs["tiled"]``, a
    :class:`TiledKernel`), or say why not (``kernel.attrs["tiling"]``). ``clones`` maps the
    loop's blocks to the kernel's copies of them. A 1-D kernel that is not tiled streams
    where it can (:func:`attach_streaming`, given ``accesses``: the index in
    ``plan.accesses`` of each of the kernel's affine loads and stores, by the op's id)."""
    kernel.attrs["tiling"] = _tile(module, kernel, plan, clones)
    if kernel.attrs["tiling"] != "tiled" and not plan.collapse:
        attach_streaming(module, kernel, accesses)  # several iterations per thread where it streams


def _tile(module: Module, kernel: Function, plan: LoopPlan, clones: dict[Block, Block]) -> str:
    """Attach ``kernel``'s tiled variants; "tiled", or why not."""
    if not config.tiling_enabled():
        return f"tiling is off ({config.TILING}=off)"
    try:
        nest = recognise(kernel, plan, clones)
        row_bytes = sum(op.results[0].type.bits // 8 for op, axis in nest.loads if axis == "i")
        col_bytes = sum(op.results[0].type.bits // 8 for op, axis in nest.loads if axis == "j")
        carried = sum(-(-nest.header.args[p].type.bits // 32) for p in nest.carried)
        counts = (sum(axis == "i" for _, axis in nest.loads), sum(axis == "j" for _, axis in nest.loads))
        if nest.dims == 1:
            shape, host_shape = row_shape(nest.row_stride, row_bytes, col_bytes), ROW_HOST_SHAPE
        else:
            shape, host_shape = choose_tile(row_bytes, col_bytes, carried, counts), HOST_SHAPE
        if shape is None:
            raise NotTileable("no tile fits the device model's shared memory and registers")
    except NotTileable as exc:
        return str(exc)
    blocks = resident_blocks(
        shape, shape.shared_bytes(row_bytes, col_bytes), estimated_registers(shape, carried, *counts)
    )
    gpu_fn = TileBuilder(module, nest, shape, on_gpu=True).build()
    host_fn = TileBuilder(module, nest, host_shape, on_gpu=False).build()
    kernel.attrs["tiled"] = TiledKernel(gpu_fn.index, shape, host_fn.index, host_shape, blocks)
    return "tiled"


def _allowed(op: Op) -> bool:
    """Pure arithmetic that cannot trap, or a load the guards proved in bounds."""
    if op.name == "mem.load":
        return bool(op.attrs.get("proven")) and op.results[0].type in NUMBERS
    return op.name.startswith("arith.") and op.opdef.pure and op.name not in TRAPPING_OPS


def recognise(kernel: Function, plan: LoopPlan, clones: dict[Block, Block]) -> Nest:
    """The gemm shape of a 2-D loop kernel, or the gemv shape of a 1-D one, or
    :class:`NotTileable` naming what differs."""
    if len(plan.collapse) > 1:
        raise NotTileable(
            f"tiling covers 1-D and 2-D grids, this one has {len(plan.collapse) + 1} dimensions"
        )
    if plan.reductions:
        raise NotTileable("the nest has reductions")
    dims = len(plan.collapse) + 1
    if dims == 1 and (plan.phases or plan.fission or plan.rotations or plan.vector_ivs):
        raise NotTileable("the loop's kernel runs phases, rotations or vector counters")
    order = reverse_postorder(kernel)
    size = sum(len(blk.ops) for blk in order)
    if size > MAX_KERNEL_OPS:
        raise NotTileable(f"the kernel has {size} ops, more than the {MAX_KERNEL_OPS} copied per cell")
    at = {blk: n for n, blk in enumerate(order)}
    back_edges = [(blk, s) for blk in order for s in blk.successors if at[s] <= at[blk]]
    if not back_edges:
        raise NotTileable("no sequential loop runs inside the thread")
    if len(back_edges) > 1:
        raise NotTileable(
            "more than one sequential loop (or a loop of several blocks) runs inside the thread"
        )
    latch, header = back_edges[0]
    if latch is not header:
        raise NotTileable("the inner loop's body is more than one block")
    term = header.terminator
    if term.name != "cf.cond_br" or header.successors.count(header) != 1:
        raise NotTileable("the inner loop does not end in a two-way branch")
    origin = {copy: blk for blk, copy in clones.items()}[header]
    counters = {plan.counter: "i"} | ({plan.collapse[0].counter: "j"} if dims == 2 else {})
    live = {sym for _, sym, _, _ in plan.live_ins}
    ivs = {}
    for p, arg in enumerate(origin.args):
        if arg in plan.ivs:
            start, step = plan.ivs[arg]
            if not start.symbols() <= live | set(counters) or not step.symbols() <= live:
                raise NotTileable(
                    "an induction variable of the inner loop is not affine in the grid counters"
                )
            ivs[p] = (start, step)
    for p, arg in enumerate(header.args):
        if p not in ivs and arg.type not in NUMBERS:
            raise NotTileable(f"the inner loop carries a {arg.type}")
    for op in header.ops[:-1]:
        if not _allowed(op):
            raise NotTileable(
                f"the inner loop's body has {op.name}{_where(op)}, not pure arithmetic and proven loads"
            )
    deps = _Dependence(kernel, header, ivs, counters, dims)
    loads = []
    strides = []
    for op in header.ops:
        if op.name == "mem.load":
            axes = deps.of(op.operands[0], f"the address of the load{_where(op)}")
            if axes == {"i", "j"}:
                raise NotTileable(f"the load{_where(op)} reads an element that follows both grid counters")
            strides.append(_row_stride(deps, op) if dims == 1 and axes else 0)
            loads.append((op, "j" if axes == {"j"} or (dims == 1 and not axes) else "i"))
    if not loads:
        raise NotTileable("the inner loop loads nothing")
    if dims == 1 and not any(strides):
        raise NotTileable("the inner loop reads no row")
    for v in _outside_values(header):
        deps.of(v, "a value the inner loop reads from before it")
    prefix = _prefix(order, header)
    for blk in prefix:
        for op in blk.ops[:-1]:
            if not _allowed(op):
                raise NotTileable(f"the code before the inner loop has {op.name}{_where(op)}")
        if blk.terminator.name not in ("cf.br", "cf.cond_br", "cf.switch"):
            raise NotTileable(f"the code before the inner loop ends in {blk.terminator.name}")
    back = header.successors.index(header)
    try:
        uniform = not deps.of(term.operands[0], "the loop's exit test")
    except NotTileable:  # it reads a carried value: tested per cell
        uniform = False
    nan_checked = _nan_checked(header, ivs)
    return Nest(kernel, plan, header, ivs, loads, prefix, back, nan_checked, uniform, dims, tuple(strides))


# A row load of a 1-D nest is staged where its address advances at most this many bytes an
# iteration (a row read in order, a few elements per step of an unrolled loop).
MAX_ROW_STRIDE = 64


def _row_stride(deps: _Dependence, load: Op) -> int:
    """The bytes the address of ``load`` (a 1-D nest's load that follows its row) advances
    an iteration, or :class:`NotTileable` where that is not a constant of at most
    :data:`MAX_ROW_STRIDE` bytes, or is no less than what it advances from one row to the
    next (where that is a constant): a load that walks down a column as the loop runs is
    read at neighbouring addresses by neighbouring threads already."""
    stride, across = deps.stride(load.operands[0]), deps.stride(load.operands[0], along="i")
    if (
        stride is None
        or not 0 < abs(stride) <= MAX_ROW_STRIDE
        or (across is not None and abs(across) <= abs(stride))
    ):
        raise NotTileable(
            f"the load{_where(load)} does not read along its row (a 1-D kernel's row loads must)"
        )
    return abs(stride)


# Ops whose float operands' NaN bits never show in a result that is not a NaN: arithmetic
# propagates a NaN, a comparison gives the same answer for every NaN, a select passes one
# operand on as it is, and neg and abs keep a NaN a NaN.
_NAN_PROPAGATING = frozenset({
    "arith.fadd", "arith.fsub", "arith.fmul", "arith.fdiv", "arith.cmpf", "arith.select",
    "arith.fneg", "arith.fabs",
})  # fmt: skip
# The arithmetic whose NaN handling the engine can leave out (numeric.FLOAT_ARITHMETIC).
_NAN_RULED = frozenset({"arith.fadd", "arith.fsub", "arith.fmul", "arith.fdiv"})


def _nan_checked(header: Block, ivs: dict) -> bool:
    """Whether the loop carries a float and every op of its body that reads a float is one
    of :data:`_NAN_PROPAGATING`: then an iteration's results differ from Wasm's only if a
    NaN arose, and any NaN that matters reaches a carried value, where the engine sees it."""
    floats = [a for p, a in enumerate(header.args) if p not in ivs and a.type.is_float]
    if not floats:
        return False
    for op in header.ops[:-1]:
        if any(v.type.is_float for v in op.operands) and op.name not in _NAN_PROPAGATING:
            return False
    return True


def _outside_values(header: Block) -> list[Value]:
    """Values defined before the loop that its body (branch included) reads, once each."""
    found: dict[Value, None] = {}
    for op in header.ops:
        operands = [*op.operands, *(v for succ in op.successors for v in succ.args)]
        for v in operands:
            inside = v.owner is header or (isinstance(v.owner, Op) and v.owner.block is header)
            if not inside:
                found[v] = None
    return list(found)


def _where(op: Op) -> str:
    return f" at +0x{op.offset:x}" if op.offset is not None else ""


def _prefix(order: list[Block], header: Block) -> list[Block]:
    """The blocks from which ``header`` is reached, other than itself, in reverse postorder."""
    reaches = {header}
    changed = True
    while changed:
        changed = False
        for blk in order:
            if blk not in reaches and any(s in reaches for s in blk.successors):
                reaches.add(blk)
                changed = True
    return [blk for blk in order if blk in reaches and blk is not header]


class _Dependence:
    """Which grid counters (``"i"``: the kernel's first, ``"j"``: its second) a value of
    the kernel follows, through pure arithmetic, block arguments of one incoming edge,
    and the inner loop's induction variables (by their start's symbols)."""

    def __init__(
        self, kernel: Function, header: Block, ivs: dict[int, tuple[Poly, Poly]], counters: dict, dims: int
    ):
        self.kernel = kernel
        self.header = header
        self.ivs = ivs
        self.counters = counters
        self.dims = dims  # the kernel's first ``dims`` parameters are its grid counters
        self.incoming: dict[Block, list[Successor]] = {}
        for blk in kernel.blocks:
            for succ in blk.terminator.successors if blk.terminator else ():
                self.incoming.setdefault(succ.block, []).append(succ)
        self.memo: dict[Value, frozenset] = {}

    def of(self, value: Value, what: str) -> set[str]:
        """The counters ``value`` follows; ``what`` names it in the refusal."""
        found = self.memo.get(value)
        if found is None:
            found = self.memo[value] = frozenset(self._of(value, what))
        return set(found)

    def _of(self, value: Value, what: str) -> set[str]:
        owner = value.owner
        if isinstance(owner, Block):
            if owner is self.kernel.entry:
                return {("i", "j")[value.index]} if value.index < self.dims else set()
            if owner is self.header:
                if value.index not in self.ivs:
                    raise NotTileable(f"{what} follows a value the loop carries")
                start = self.ivs[value.index][0]
                return {self.counters[s] for s in start.symbols() if s in self.counters}
            edges = self.incoming.get(owner, [])
            if len(edges) != 1:
                raise NotTileable(f"{what} merges values from several branches")
            return self.of(edges[0].args[value.index], what)
        if owner.name == "arith.constant":
            return set()
        if owner.name.startswith("arith.") and _allowed(owner):
            return set().union(*(self.of(v, what) for v in owner.operands))
        raise NotTileable(f"{what} comes from {owner.name}")

    def stride(self, value: Value, along: str = "k") -> int | None:
        """What ``value`` (an address the walk of :meth:`of` accepted) gains from one
        iteration of the inner loop to the next (``along="k"``: the steps of the induction
        variables it adds), or from one row to the next (``"i"``: the grid counter's
        coefficient in those variables' starts, and the counter itself), scaled by
        constants; None where that is not a constant."""
        owner = value.owner
        if isinstance(owner, Block):
            if owner is self.kernel.entry:
                return int(along == "i" and value.index == 0)
            if owner is self.header:
                start, step = self.ivs[value.index]
                if along == "k":
                    return step.constant if step.is_constant() else None
                counter = next(s for s, axis in self.counters.items() if axis == "i")
                parts = start.split(counter)
                return parts[1].constant if parts is not None and parts[1].is_constant() else None
            return self.stride(self.incoming[owner][0].args[value.index], along)
        if owner.name == "arith.constant":
            return 0
        parts = [self.stride(v, along) for v in owner.operands]
        if None in parts:
            return None
        if not any(parts):
            return 0
        if owner.name == "arith.add":
            return parts[0] + parts[1]
        if owner.name == "arith.sub":
            return parts[0] - parts[1]
        constant = [_constant(v) for v in owner.operands]
        if owner.name == "arith.mul" and None not in (constant[0], parts[1]) and parts[0] == 0:
            return constant[0] * parts[1]
        if owner.name == "arith.mul" and None not in (constant[1], parts[0]) and parts[1] == 0:
            return constant[1] * parts[0]
        if owner.name == "arith.shl" and constant[1] is not None and 0 <= constant[1] < 32:
            return parts[0] << constant[1]
        if owner.name in ("arith.zext", "arith.sext", "arith.trunc"):
            return parts[0]
        return None


def _constant(value: Value) -> int | None:
    """The signed value of an integer constant op's result, or None."""
    owner = value.owner
    if isinstance(owner, Block) or owner.name != "arith.constant" or not value.type.is_int:
        return None
    bits = owner.attrs["value"] & ((1 << value.type.bits) - 1)
    return bits - (1 << value.type.bits) if bits >> (value.type.bits - 1) else bits


class _Steps:
    """The engine's steps for :class:`TileBuilder`: reading a stage, one iteration of every
    cell (checked per cell, or all at once in a full stage), and the redo of a tile where a
    NaN arose. Apart only to keep each class readable at one sitting."""

    nest: Nest
    shape: TileShape
    cells: list[tuple[int, int]]
    split = False  # (see TileBuilder.split)

    def redo_nans(self, b: Builder, before: list[Value], after: list[Value]) -> list[Value]:
        """A cell whose carried floats hold a NaN after a tile run without Wasm's NaN rules
        goes back to where the tile found it and leaves the engine: its own code redoes the
        iterations from there, with the rules."""
        cells, width = len(self.cells), len(self.nest.carried)
        counts, carried = list(after[:cells]), list(after[cells:])
        for n in range(cells):
            nan = None
            for w in range(width):
                value = carried[n * width + w]
                if value.type.is_float:
                    test = b.value(arith.cmpf, value, value, pred="une")
                    nan = test if nan is None else b.value(arith.select, nan, nan, test)
            counts[n] = b.value(arith.select, nan, before[n], counts[n])
            for w in range(width):
                k = cells + n * width + w
                carried[n * width + w] = b.value(arith.select, nan, before[k], carried[n * width + w])
        return counts + carried

    def read_staged(self, b: Builder, m0: Value, mm: Value) -> dict[tuple[int, int], Value]:
        """Iteration ``mm`` of the stage from ``m0``, each staged load's values for this
        thread's rows or columns, keyed (load, row or column of the register block)."""
        nest, shape = self.nest, self.shape
        mm = self.add(b, mm, self.buffer(b, m0))
        staged: dict[tuple[int, int], Value] = {}
        for q, (load, axis) in enumerate(nest.loads):
            for k in range(shape.cells_y if axis == "i" else shape.cells_x):
                if axis == "i":
                    at = self.add(b, b.value(arith.mul, mm, b.constant(I32, shape.rows + 1)),
                                  self.add(b, b.constant(I32, k * shape.threads_y), self.ty))  # fmt: skip
                else:
                    at = self.add(b, b.value(arith.mul, mm, b.constant(I32, shape.cols)),
                                  self.add(b, b.constant(I32, k * shape.threads_x), self.tx))  # fmt: skip
                load_type = load.results[0].type
                staged[q, k] = b.op(gpu.shared_load, [at], {"array": f"s{q}", "type": load_type}).results[0]
        return staged

    def body(self, b: Builder, cell: tuple[int, int], m: Value, staged: dict, carried: list[Value]):
        """The loop body for ``cell`` at iteration ``m`` on staged values: the carried values
        it passes back, and whether the loop goes on after it."""
        nest = self.nest
        cy, cx = cell
        values = dict(self.outside[cell])
        for p, arg in enumerate(nest.header.args):
            if p in nest.ivs:
                values[arg] = self.iv_at(b, p, self.starts[cell, p], m)
        for w, p in enumerate(nest.carried):
            values[nest.header.args[p]] = carried[w]
        for q, (load, axis) in enumerate(nest.loads):
            values[load.results[0]] = staged[q, cy if axis == "i" else cx]
        body = [op for op in nest.header.ops[:-1] if op.name != "mem.load"]
        self.copy_ops(b, body, values, nan_free=nest.nan_checked)
        term = nest.header.terminator
        back_args = term.successors[nest.back].args
        return [values[back_args[p]] for p in nest.carried], self.goes_on(b, values[term.operands[0]])

    def buffer(self, b: Builder, m0: Value) -> Value:
        """Where the stage from ``m0`` lies in the shared arrays, in iterations: 0, or with
        two buffers (:attr:`TileBuilder.split`), ``depth`` for every other stage."""
        if not self.split:
            return b.constant(I32, 0)
        return b.value(arith.and_, m0, b.constant(I32, self.shape.depth))

    def goes_on(self, b: Builder, condition: Value) -> Value:
        """The header's branch condition as "the loop goes round again" (i1)."""
        if self.nest.back == 0:
            return condition
        return b.value(arith.cmpi, b.value(arith.zext, condition, to=I32), b.constant(I32, 0), pred="eq")

    def iteration(self, b: Builder, m0: Value, mm: Value, state: list[Value]) -> list[Value]:
        """One iteration of every cell: the loop body's ops on staged values; a cell takes
        the new values only where it is at this iteration and the loop goes on after it."""
        cells, width = len(self.cells), len(self.nest.carried)
        m = self.add(b, m0, mm)
        staged = self.read_staged(b, m0, mm)
        counts, carried = list(state[:cells]), list(state[cells:])
        next_m = self.add(b, m, b.constant(I32, 1))
        for n, cell in enumerate(self.cells):
            mine = carried[n * width : (n + 1) * width]
            new, goes_on = self.body(b, cell, m, staged, mine)
            here = b.value(arith.cmpi, counts[n], m, pred="eq")
            commit = b.value(arith.select, here, goes_on, b.constant(I1, 0))
            counts[n] = b.value(arith.select, commit, next_m, counts[n])
            for w in range(width):
                carried[n * width + w] = b.value(arith.select, commit, new[w], mine[w])
        return counts + carried

    def full_tile(self, b: Builder, m0: Value, counts: list[Value], goes_on: Value | None = None) -> Value:
        """Whether every cell of this thread is at iteration ``m0`` and the loop goes on after
        each of the stage's iterations, by its exit test, which no cell's value enters
        (``Nest.uniform_exit``): then the stage runs without a test per cell and iteration.
        ``goes_on``: the second half, where another thread found it (:meth:`stage_goes_on`)."""
        full = self.stage_goes_on(b, m0) if goes_on is None else goes_on
        for count in counts:
            full = b.value(arith.select, b.value(arith.cmpi, count, m0, pred="eq"), full, b.constant(I1, 0))
        return full

    def stage_goes_on(self, b: Builder, m0: Value) -> Value:
        """Whether the loop goes on after each of the stage's iterations from ``m0``, by its
        exit test (``Nest.uniform_exit``: the same in every thread)."""
        condition = self.nest.header.terminator.operands[0]
        tests = [
            self.goes_on(
                b, self.slice(b, condition, self.i0, self.j0, self.add(b, m0, b.constant(I32, mm)), {})
            )
            for mm in range(self.shape.depth)
        ]
        while len(tests) > 1:  # pairwise, so that no test waits for more than log2(depth) others
            odd = tests[len(tests) & ~1 :]
            pairs = zip(tests[0::2], tests[1::2], strict=False)
            tests = [b.value(arith.select, x, y, b.constant(I1, 0)) for x, y in pairs] + odd
        return tests[0]

    def fast_iteration(self, b: Builder, m0: Value, mm: Value, carried: list[Value]) -> list[Value]:
        """One iteration of every cell of a full stage (see :meth:`full_tile`)."""
        width = len(self.nest.carried)
        m = self.add(b, m0, mm)
        staged = self.read_staged(b, m0, mm)
        out = []
        for n, cell in enumerate(self.cells):
            out += self.body(b, cell, m, staged, carried[n * width : (n + 1) * width])[0]
        return out


class _Staging:
    """How :class:`TileBuilder`'s threads stage: each thread's share of a stage, its loads
    from linear memory and stores to shared memory, the L2 hints, and (with staging-only
    threads) the handing of each stage to the threads that compute. Apart only to keep
    each class readable at one sitting."""

    nest: Nest
    shape: TileShape
    split: bool
    stagers: bool
    fn: Function
    ty: Value
    tx: Value
    i0: Value
    j0: Value

    def prefetch_rows(self, b: Builder, m: Value) -> None:
        """Hints that bring into the L2 cache the lines of this thread's own row that the stage
        from iteration ``m`` reads (a row tile: one row a thread), so that the stage's loads,
        issued a stage ahead, find them there (:data:`L2_AHEAD`)."""
        nest, shape = self.nest, self.shape
        row = self.add(b, self.i0, self.ty)
        for (load, axis), stride in zip(nest.loads, nest.strides, strict=True):
            if axis != "i" or not stride:
                continue
            for k in range(0, shape.depth, max(1, LINE_BYTES // stride)):
                address = self.slice(
                    b, load.operands[0], row, self.j0, self.add(b, m, b.constant(I32, k)), {}
                )
                b.op(gpu.prefetch, [address], {"offset": load.attrs["offset"]})

    def stage_layout(self, b: Builder) -> list[tuple[int, Op, Value, Value, Value, Value]]:
        """Each thread's share of a stage: per staged load and share, the load's number, the
        load, the iteration of the stage and grid counters its element is read at, and its
        slot in the load's shared array. Share ``u`` of a thread is element ``flat + u *
        threads`` of the stage (row by row, or iteration by iteration for column loads), so
        neighbouring threads read neighbouring elements; a stage of fewer elements than the
        block has threads is read by its first threads, the others reading its last element
        again (and storing the same value to the same slot)."""
        nest, shape = self.nest, self.shape
        layout = []
        flat = self.flat(b)
        threads = shape.block_threads if self.stagers else shape.threads
        if self.split:  # (the threads that compute have no share)
            flat = b.value(arith.sub, flat, b.constant(I32, shape.stage_from))
            threads -= shape.stage_from
        for q, (load, axis) in enumerate(nest.loads):
            # ``inner`` elements of the stage are contiguous: a row's iterations, or an iteration's columns
            inner, across = (shape.depth, shape.rows) if axis == "i" else (shape.cols, shape.depth)
            total = inner * across
            assert total % threads == 0 or threads % total == 0, "powers of two"
            mine = flat
            if total < threads:
                last = b.constant(I32, total - 1)
                mine = b.value(arith.select, b.value(arith.cmpi, flat, last, pred="ult"), flat, last)
            # The thread's own position, then each share's constant offset from it.
            low = b.value(arith.and_, mine, b.constant(I32, inner - 1))
            high = b.value(arith.shr_u, mine, b.constant(I32, inner.bit_length() - 1))
            for u in range(max(1, total // threads)):
                first = u * threads
                a = self.add(b, low, b.constant(I32, first % inner))
                c = self.add(b, high, b.constant(I32, first // inner))
                if axis == "i":  # a: the iteration, c: the row
                    mm, i, j = a, self.add(b, self.i0, c), self.j0
                    slot = self.add(b, b.value(arith.mul, a, b.constant(I32, shape.rows + 1)), c)
                else:  # a: the column, c: the iteration
                    mm, i, j = c, self.i0, self.add(b, self.j0, a)
                    slot = self.add(b, b.value(arith.mul, c, b.constant(I32, shape.cols)), a)
                layout.append((q, load, mm, i, j, slot))
        return layout

    def stage_loads(self, b: Builder, layout: list, m0: Value) -> list[Value]:
        """This thread's share of the ``depth`` iterations from ``m0`` of each staged load,
        read from linear memory (speculatively: past the grid or the loop they may read
        outside memory, and reach no cell that commits)."""
        values = []
        for _, load, mm, i, j, _ in layout:
            m = self.add(b, m0, mm)
            address = self.slice(b, load.operands[0], i, j, m, {})
            attrs = {k: v for k, v in load.attrs.items() if k != "proven"}
            values.append(b.op(mem.load, [address], {**attrs, "speculative": True}).results[0])
        return values

    def stage_stores(self, b: Builder, layout: list, values: list[Value], m0: Value | None = None) -> None:
        """This thread's share of a stage (:meth:`stage_loads`) into shared memory; with
        two buffers, into the one of the stage from ``m0``."""
        shape = self.shape
        buffer = None if m0 is None else self.buffer(b, m0)
        for (q, *_, slot), value in zip(layout, values, strict=True):
            if buffer is not None:
                across = shape.rows + 1 if self.nest.loads[q][1] == "i" else shape.cols
                slot = self.add(b, slot, b.value(arith.mul, buffer, b.constant(I32, across)))
            b.op(gpu.shared_store, [slot, value], {"array": f"s{q}"})

    def flat(self, b: Builder) -> Value:
        """This thread's position in its block."""
        return self.add(b, b.value(arith.mul, self.ty, b.constant(I32, self.shape.threads_x)), self.tx)

    def staging(self, b: Builder) -> Value:
        """Whether this thread stages (i1): with :attr:`split`, those from ``stage_from`` on."""
        return b.value(arith.cmpi, self.flat(b), self.const(b, self.shape.stage_from), pred="uge")

    def publish(self, b: Builder, layout: list, values: list[Value], m0: Value) -> None:
        """A staging thread's share of the stage from ``m0`` into its buffer, and (the same
        from every staging thread) whether that stage runs in full by the loop's exit test;
        the next barrier shows both to the threads that compute."""
        self.stage_stores(b, layout, values, m0)
        if self.nest.uniform_exit:
            goes_on = b.value(arith.zext, self.stage_goes_on(b, m0), to=I32)
            b.op(gpu.shared_store, [self.full_word(b, m0), goes_on], {"array": "full"})

    def full_word(self, b: Builder, m0: Value) -> Value:
        """The word of array "full" for the stage from ``m0`` (its buffer's)."""
        return b.value(arith.shr_u, self.buffer(b, m0), b.constant(I32, self.shape.depth.bit_length() - 1))


class TileBuilder(_Steps, _Staging):
    """Builds the tiled function ``tile_<kernel>_<gpu|host>(i0, j0, i_end, j_end, live-ins...)``
    computing the cells ``[i0, min(i0 + rows, i_end)) x [j0, min(j0 + cols, j_end))``."""

    def __init__(self, module: Module, nest: Nest, shape: TileShape, on_gpu: bool):
        self.module = module
        self.nest = nest
        self.shape = shape
        self.on_gpu = on_gpu
        kernel = nest.kernel
        params = (I32, I32, I32, I32, *kernel.params[nest.dims :])
        name = f"tile_{kernel.name}_{'gpu' if on_gpu else 'host'}"
        self.fn = Function(name, len(module.functions), params, ())
        module.functions.append(self.fn)
        # Threads that only stage (TileShape.block_y): they leave each stage to the others
        # once its loads are issued.
        self.stagers = on_gpu and shape.launch_y > shape.threads_y
        # Threads that only compute, where the shape says (TileShape.stage_from). The
        # staging threads then store each stage while the others compute the one before, in
        # two buffers (:meth:`buffer`), and tell them whether a stage runs in full (array
        # "full", a word a buffer).
        self.split = self.stagers and shape.stage_from > 0
        buffers = 2 if self.split else 1
        self.fn.attrs["shared"] = {
            f"s{q}": (
                op.results[0].type,
                buffers * shape.depth * (shape.rows + 1 if axis == "i" else shape.cols),
            )
            for q, (op, axis) in enumerate(nest.loads)
        }
        if self.split and nest.uniform_exit:
            self.fn.attrs["shared"]["full"] = (I32, buffers)
        self.entry = self.fn.add_block(params)
        self.i0, self.j0, self.i_end, self.j_end, *self.live = self.entry.args
        self.symbols = {sym: v for (_, sym, _, _), v in zip(nest.plan.live_ins, self.live, strict=True)}
        self.counter_i = nest.plan.counter
        self.counter_j = nest.plan.collapse[0].counter if nest.dims == 2 else None
        self.cells = [(cy, cx) for cy in range(shape.cells_y) for cx in range(shape.cells_x)]

    # -- small helpers ----------------------------------------------------------------

    def entry_values(self, i: Value, j: Value) -> list[Value]:
        """What the kernel's parameters hold for the cell ``(i, j)``: its grid counters (the
        row alone in a 1-D nest) and the live-ins."""
        return [i, j, *self.live] if self.nest.dims == 2 else [i, *self.live]

    def const(self, b: Builder, value: int, ty: Type = I32) -> Value:
        return b.constant(ty, value)

    def add(self, b: Builder, x: Value, y: Value) -> Value:
        return b.value(arith.add, x, y)

    def poly(self, b: Builder, poly: Poly, ty: Type, i: Value, j: Value) -> Value:
        """``poly`` with the grid counters at ``i`` and ``j`` and live-ins at the parameters."""
        total = None
        for monomial, coeff in poly.terms.items():
            term = b.constant(ty, coeff)
            for sym in monomial:
                factor = i if sym is self.counter_i else j if sym is self.counter_j else self.symbols[sym]
                if factor.type is not ty:
                    factor = b.value(arith.sext, factor, to=ty)
                term = b.value(arith.mul, term, factor)
            total = term if total is None else b.value(arith.add, total, term)
        return total if total is not None else b.constant(ty, 0)

    def iv_at(self, b: Builder, p: int, start: Value, m: Value) -> Value:
        """Induction variable ``p`` at iteration ``m`` from its ``start``."""
        ty = start.type
        step = self.poly(b, self.nest.ivs[p][1], ty, m, m)  # steps hold live-ins only
        count = m if ty is I32 else b.value(arith.sext, m, to=ty)
        return b.value(arith.add, start, b.value(arith.mul, step, count))

    def copy_ops(self, b: Builder, ops: list[Op], values: dict[Value, Value], nan_free: bool = False) -> None:
        for op in ops:
            attrs = dict(op.attrs)
            if nan_free and op.name in _NAN_RULED:
                attrs["nan_free"] = True
            new = b.op(op.opdef, [values[v] for v in op.operands], attrs)
            for old, result in zip(op.results, new.results, strict=True):
                values[old] = result

    def copy_blocks(self, blocks: list[Block], values: dict[Value, Value], edge) -> dict[Block, Block]:
        """Copies of the kernel's ``blocks`` (in reverse postorder); ``edge(op, succ,
        copies)`` gives the copy of a branch's successor, or None for the plain copy."""
        kernel = self.nest.kernel
        copies = {}
        for blk in blocks:
            copies[blk] = self.fn.add_block([] if blk is kernel.entry else [a.type for a in blk.args])
            if blk is not kernel.entry:
                values.update(zip(blk.args, copies[blk].args, strict=True))
        for blk in blocks:
            b = Builder(self.fn, copies[blk])
            self.copy_ops(b, blk.ops[:-1], values)
            term = blk.terminator
            if term.name == "cf.return":
                edge(term, None, copies)
                continue
            succs = []
            for succ in term.successors:
                made = edge(term, succ, copies)
                succs.append(made or Successor(copies[succ.block], [values[v] for v in succ.args]))
            b.op(term.opdef, [values[v] for v in term.operands], dict(term.attrs), succs)
        return copies

    def place(self, b: Builder, cell: tuple[int, int]) -> tuple[Value, Value, Value]:
        """The cell's grid counters and whether it lies inside the grid, computed where they
        are needed (kept across the engine, they would hold registers of every cell)."""
        cy, cx = cell
        shape = self.shape
        row = self.add(b, self.i0, self.add(b, self.const(b, cy * shape.threads_y), self.ty))
        col = self.add(b, self.j0, self.add(b, self.const(b, cx * shape.threads_x), self.tx))
        inside = b.value(arith.select, b.value(arith.cmpi, row, self.i_end, pred="ult"),
                         b.value(arith.cmpi, col, self.j_end, pred="ult"),
                         b.constant(I1, 0))  # fmt: skip
        if self.stagers:  # a thread that only stages has no cell
            inside = b.value(arith.select, self.holds_cells(b), inside, b.constant(I1, 0))
        return row, col, inside

    def holds_cells(self, b: Builder) -> Value:
        """Whether this thread computes cells (i1): with staging-only threads
        (:attr:`stagers`), the first ``threads_y`` rows of threads do."""
        return b.value(arith.cmpi, self.ty, self.const(b, self.shape.threads_y), pred="ult")

    # -- the function ------------------------------------------------------------------

    def build(self) -> Function:
        nest = self.nest
        b = Builder(self.fn, self.entry)
        if self.on_gpu:
            self.tx, self.ty = (b.value(gpu.thread_id, dim=d) for d in ("x", "y"))
        else:
            self.tx = self.ty = self.const(b, 0)
        carried_types = [nest.header.args[p].type for p in nest.carried]
        # Phase 1: each cell's prefix, ending in its join block (entered?, carried values).
        joins = []
        for cell in self.cells:
            join = self.fn.add_block([I32, *carried_types])
            self.prefix(b, cell, join)
            b = Builder(self.fn, join)
            joins.append(join)
        _, exits = self.engine(b, joins)
        # Phase 3: each cell resumes its own code.
        b = Builder(self.fn, exits)
        cells, width = len(self.cells), len(nest.carried)
        for n, cell in enumerate(self.cells):
            after = self.fn.add_block()
            carried = exits.args[cells + n * width : cells + (n + 1) * width]
            self.resume(b, cell, exits.args[n], carried, after)
            b = Builder(self.fn, after)
        b.ret([])
        verify_function(self.fn)
        return self.fn

    def prefix(self, b: Builder, cell: tuple[int, int], join: Block) -> None:
        nest = self.nest
        row, col, inside = self.place(b, cell)
        zeros = [b.constant(nest.header.args[p].type, 0) for p in nest.carried]
        values = dict(zip(nest.kernel.entry.args, self.entry_values(row, col), strict=True))
        in_prefix = set(nest.prefix)

        def edge(op, succ, copies):
            if succ.block is nest.header:
                mapped = [values[succ.args[p]] for p in nest.carried]
                return Successor(join, [Builder(self.fn, copies[op.block]).constant(I32, 1), *mapped])
            if succ.block not in in_prefix:  # around the loop: the resume runs it
                return Successor(join, [Builder(self.fn, copies[op.block]).constant(I32, 0), *zeros])
            return None

        copies = self.copy_blocks(nest.prefix, values, edge)
        b.cond_br(inside, copies[nest.kernel.entry], [], join, [b.constant(I32, 0), *zeros])

    def engine(self, b: Builder, joins: list[Block]) -> tuple[Block, Block]:
        """The lock-step loop over tiles of ``depth`` iterations; returns its head and its
        exit block, whose arguments are each cell's iteration count then its carried values.
        With the shape's ``prefetch`` (GPU), the head also carries the thread's share of the
        stage it is about to store, loaded during the stage before. With :attr:`split`, the
        staging threads store the next stage into the other buffer while the others
        compute this one, and the vote at the head is the stage's only barrier."""
        nest, shape = self.nest, self.shape
        cells = len(self.cells)
        carried = nest.carried
        carried_types = [nest.header.args[p].type for p in carried]
        self.starts = {}
        self.outside: dict[tuple[int, int], dict[Value, Value]] = {}
        counts = []
        for n, cell in enumerate(self.cells):
            row, col, _ = self.place(b, cell)
            for p, (start, _) in nest.ivs.items():
                self.starts[cell, p] = self.poly(b, start, nest.header.args[p].type, row, col)
            memo: dict[Value, Value] = {}
            self.outside[cell] = {
                v: self.slice(b, v, row, col, None, memo) for v in _outside_values(nest.header)
            }
            entered = b.value(arith.cmpi, joins[n].args[0], b.constant(I32, 0), pred="ne")
            counts.append(b.value(arith.select, entered, b.constant(I32, 0), b.constant(I32, -1)))
        state_types = [I32] * cells + carried_types * cells
        prefetch = self.on_gpu and shape.prefetch
        layout = self.stage_layout(b) if prefetch else []
        ahead = self.stage_loads(b, layout, b.constant(I32, 0)) if prefetch else []
        if self.split:  # the staging threads store the first stage, and load the second
            first, joined = self.fn.add_block(), self.fn.add_block()
            b.cond_br(self.staging(b), first, [], joined, [])
            b = Builder(self.fn, first)
            self.publish(b, layout, ahead, b.constant(I32, 0))
            b.br(joined)
            b = Builder(self.fn, joined)
            ahead = self.stage_loads(b, layout, b.constant(I32, shape.depth))
        head = self.fn.add_block([I32, *state_types, *(v.type for v in ahead)])
        exits = self.fn.add_block(state_types)
        initial = counts + [v for join in joins for v in join.args[1:]]
        b.br(head, [b.constant(I32, 0), *initial, *ahead])
        b = Builder(self.fn, head)
        m0, *state = head.args
        state, ahead = state[: len(state_types)], state[len(state_types) :]
        state_at_head = state
        busy = None
        for count in state[:cells]:
            active = b.value(arith.zext, b.value(arith.cmpi, count, m0, pred="eq"), to=I32)
            busy = active if busy is None else b.value(arith.or_, busy, active)
        if self.on_gpu:
            busy = b.value(gpu.barrier_or, busy)
        stage = self.fn.add_block()
        b.cond_br(b.value(arith.cmpi, busy, b.constant(I32, 0), pred="ne"), stage, [], exits, state)
        b = Builder(self.fn, stage)
        step = self.fn.add_block([I32, *state_types])
        ahead_types = [v.type for v in ahead]
        tail = self.fn.add_block([*state_types, *ahead_types])
        if self.split:  # the staging threads store the next stage and load the one after
            store, work = self.fn.add_block(), self.fn.add_block()
            b.cond_br(self.staging(b), store, [], work, [])
            b = Builder(self.fn, store)
            self.publish(b, layout, ahead, self.add(b, m0, b.constant(I32, shape.depth)))
            loaded = self.stage_loads(b, layout, self.add(b, m0, b.constant(I32, 2 * shape.depth)))
            b.op(gpu.issued, loaded)
            b.br(tail, [*state, *loaded])
            b = Builder(self.fn, work)
            cells_of_mine = self.fn.add_block()  # (the computing warp's threads past the rows: none)
            b.cond_br(self.holds_cells(b), cells_of_mine, [], tail, [*state, *ahead])
            b = Builder(self.fn, cells_of_mine)
        else:
            if not prefetch:
                layout = self.stage_layout(b)
            self.stage_stores(b, layout, ahead if prefetch else self.stage_loads(b, layout, m0))
            if self.on_gpu:
                b.op(gpu.barrier, ())
            if prefetch:  # the next stage's loads, in flight while this one computes
                ahead = self.stage_loads(b, layout, self.add(b, m0, b.constant(I32, shape.depth)))
                b.op(gpu.issued, ahead)
            if self.stagers:  # a thread without a cell is done with the stage
                work = self.fn.add_block()
                b.cond_br(self.holds_cells(b), work, [], tail, [*state, *ahead])
                b = Builder(self.fn, work)
        if prefetch and nest.dims == 1:
            self.prefetch_rows(b, self.add(b, m0, b.constant(I32, L2_AHEAD * shape.depth)))
        if nest.uniform_exit:
            fast = self.fn.add_block([I32, *carried_types * cells])
            told = None
            if self.split:  # what the staging threads found
                found = b.op(
                    gpu.shared_load, [self.full_word(b, m0)], {"array": "full", "type": I32}
                ).results[0]
                told = b.value(arith.cmpi, found, b.constant(I32, 0), pred="ne")
            full = self.full_tile(b, m0, state[:cells], told)
            b.cond_br(full, fast, [b.constant(I32, 0), *state[cells:]], step, [b.constant(I32, 0), *state])
            b = Builder(self.fn, fast)
            mm, *new_carried = fast.args
            unroll = self.fast_unroll()
            for u in range(unroll):  # (each iteration's shared loads need not wait for the last's sums)
                new_carried = self.fast_iteration(b, m0, self.add(b, mm, b.constant(I32, u)), new_carried)
            more = b.value(arith.cmpi, mm, b.constant(I32, shape.depth - unroll), pred="ult")
            done = [self.add(b, m0, b.constant(I32, shape.depth))] * cells
            b.cond_br(
                more,
                fast,
                [self.add(b, mm, b.constant(I32, unroll)), *new_carried],
                tail,
                [*done, *new_carried, *ahead],
            )
        else:
            b.br(step, [b.constant(I32, 0), *state])
        b = Builder(self.fn, step)
        mm, *state = step.args
        new_state = self.iteration(b, m0, mm, state)
        more = b.value(arith.cmpi, mm, b.constant(I32, shape.depth - 1), pred="ult")
        b.cond_br(more, step, [self.add(b, mm, b.constant(I32, 1)), *new_state], tail, [*new_state, *ahead])
        b = Builder(self.fn, tail)
        new_state, ahead = list(tail.args[: len(state_types)]), list(tail.args[len(state_types) :])
        if nest.nan_checked:
            new_state = self.redo_nans(b, state_at_head, new_state)
        b.br(head, [self.add(b, m0, b.constant(I32, shape.depth)), *new_state, *ahead])
        return head, exits

    def fast_unroll(self) -> int:
        """Iterations a trip of a full stage's loop runs: as many as keep the copies of the
        loop body within :data:`UNROLLED_OPS` (at most :data:`MAX_UNROLL`, a power of two,
        so a divisor of the stage's depth). A thread of few cells otherwise waits, at each
        iteration, for its shared loads and then for its sums in turn."""
        body = sum(op.name != "mem.load" for op in self.nest.header.ops[:-1]) * len(self.cells)
        unroll = 1
        while unroll < MAX_UNROLL and body * unroll * 2 <= UNROLLED_OPS:
            unroll *= 2
        return unroll if self.shape.depth % unroll == 0 else 1

    def slice(self, b: Builder, value: Value, i: Value, j: Value, m: Value, memo: dict) -> Value:
        """``value`` of the kernel recomputed for grid counters ``(i, j)`` at iteration ``m``
        of the inner loop (what :class:`_Dependence` walked, it copies)."""
        if value in memo:
            return memo[value]
        nest = self.nest
        owner = value.owner
        if isinstance(owner, Block):
            if owner is nest.kernel.entry:
                result = self.entry_values(i, j)[value.index]
            elif owner is nest.header:
                start = self.poly(b, nest.ivs[value.index][0], value.type, i, j)
                result = self.iv_at(b, value.index, start, m)
            else:
                edge = next(
                    s for blk in nest.kernel.blocks for s in blk.terminator.successors if s.block is owner
                )
                result = self.slice(b, edge.args[value.index], i, j, m, memo)
        else:
            operands = [self.slice(b, v, i, j, m, memo) for v in owner.operands]
            result = b.op(owner.opdef, operands, dict(owner.attrs)).results[value.index]
        memo[value] = result
        return result

    def resume(
        self, b: Builder, cell: tuple[int, int], count: Value, carried: list[Value], after: Block
    ) -> None:
        """The cell's own code from the start, entering the loop at iteration ``count`` with
        the ``carried`` values the engine reached."""
        nest = self.nest
        row, col, inside = self.place(b, cell)
        starts = {
            p: self.poly(b, start, nest.header.args[p].type, row, col) for p, (start, _) in nest.ivs.items()
        }
        ivs = {p: self.iv_at(b, p, starts[p], count) for p in nest.ivs}
        entering = [
            ivs[p] if p in ivs else carried[nest.carried.index(p)] for p in range(len(nest.header.args))
        ]
        values = dict(zip(nest.kernel.entry.args, self.entry_values(row, col), strict=True))
        in_prefix = set(nest.prefix)

        def edge(op, succ, copies):
            if succ is None:  # the cell is done
                Builder(self.fn, copies[op.block]).br(after)
                return None
            if succ.block is nest.header and op.block in in_prefix:
                return Successor(copies[nest.header], entering)
            return None

        order = reverse_postorder(nest.kernel)
        copies = self.copy_blocks(order, values, edge)
        b.cond_br(inside, copies[nest.kernel.entry], [], after, [])
