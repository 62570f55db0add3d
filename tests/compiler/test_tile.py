"""Exact tiling of gemm-shaped loop nests (:mod:`compiler.tile`): the nests it takes, the
near misses it refuses with a reason, the device model's choice, the PTX of a tiled
kernel, and memories equal to wasmtime's, bit for bit, on the host backend (which runs the
tiled kernels, one thread per block) and on the GPU."""

from __future__ import annotations

import random
import re
import struct
import subprocess
from pathlib import Path

import pytest
import wasmtime

from tensorwasm.compiler.prepare import compile_loop_kernels, prepare_offload
from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget
from tensorwasm.compiler.tile import (
    DeviceModel,
    TileShape,
    choose_tile,
    estimated_registers,
    resident_blocks,
    row_shape,
)
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.support import config
from tensorwasm.support.errors import ConfigError
from tests.conftest import ROOT
from tests.offload_cases import instantiate

NESTS = ROOT / "tests/data/tile/nests.O2.wasm"
GEMM = ROOT / "benchmarks/suite/build/gemm.wasm"
MATMUL = ROOT / "examples/wasi/build/matmul.O2.wasm"
BLAS3 = ROOT / "examples/loops/build/blas3.{}.wasm"
STENCIL = ROOT / "examples/loops/build/stencil.O2.wasm"


def tiling_of(path: Path) -> dict[str, tuple[str, object]]:
    """Each function's outermost nest kernel -> (the tiler's verdict, its TiledKernel)."""
    preparation = prepare_offload(path.read_bytes())
    module = preparation.state.dialect.module
    found = {}
    for lp in preparation.prepared.loops:
        kernel = module.functions[lp.kernel_index]
        if lp.plan.collapse:
            found.setdefault(lp.plan.func.name, (kernel.attrs.get("tiling"), kernel.attrs.get("tiled")))
    return found


@pytest.mark.parametrize(
    ("path", "func"),
    [
        (GEMM, "kernel_gemm"),
        (MATMUL, "main"),
        (Path(str(BLAS3).format("O1")), "sgemm"),
        (Path(str(BLAS3).format("O2")), "sgemm"),
        (Path(str(BLAS3).format("O2")), "dgemm"),
        (NESTS, "gemm_ab"),
        (NESTS, "syrk"),
        (NESTS, "imix"),
    ],
)
def test_gemm_shaped_nests_are_tiled(path: Path, func: str) -> None:
    verdict, tiled = tiling_of(path)[func]
    assert verdict == "tiled"
    assert tiled.gpu_shape.threads == 256 and tiled.host_shape.threads == 1
    assert tiled.gpu_shape.rows % tiled.gpu_shape.threads_y == 0


@pytest.mark.parametrize(
    ("path", "func", "reason"),
    [
        (NESTS, "skew", "the load at +0x4cb reads an element that follows both grid counters"),
        (NESTS, "inplace", "the inner loop's body has mem.store at +0x60f"),
        (STENCIL, "jacobi2d", "no sequential loop runs inside the thread"),
        (STENCIL, "jacobi3d", "tiling covers 1-D and 2-D grids, this one has 3 dimensions"),
    ],
)
def test_near_misses_keep_their_kernel_and_say_why(path: Path, func: str, reason: str) -> None:
    verdict, tiled = tiling_of(path)[func]
    assert tiled is None
    assert verdict.startswith(reason)


def row_tiling_of(path: Path) -> dict[str, tuple[str, object, int]]:
    """Each function's outermost 1-D kernel -> (the tiler's verdict, its TiledKernel, the
    depth of its GPU stage or 0)."""
    preparation = prepare_offload(path.read_bytes())
    module = preparation.state.dialect.module
    found = {}
    for lp in preparation.prepared.loops:
        kernel = module.functions[lp.kernel_index]
        if not lp.plan.collapse and lp.plan.func.name not in found:
            tiled = kernel.attrs.get("tiled")
            found[lp.plan.func.name] = (
                kernel.attrs.get("tiling"),
                tiled,
                tiled.gpu_shape.depth if tiled else 0,
            )
    return found


@pytest.mark.parametrize(("func", "depth"), [("gemv_rows", 32), ("dmv_rows", 32), ("irows", 32)])
def test_row_nests_are_tiled_sixteen_rows_a_warp_that_computes_and_two_that_stage(
    func: str, depth: int
) -> None:
    """A 1-D kernel reading rows along its inner loop: 16 rows a block, a thread each of
    its first warp, in a block of 96 threads whose last 64 stage, and as many iterations a
    stage as 256 bytes of its widest row step hold (clang unrolls gemv_rows and irows by
    two: 8 bytes a step; dmv_rows reads 8-byte elements)."""
    verdict, tiled, got = row_tiling_of(NESTS)[func]
    assert verdict == "tiled"
    shape = tiled.gpu_shape
    assert (shape.threads_x, shape.threads_y, shape.cells_x, shape.cells_y) == (1, 16, 1, 1)
    assert (shape.launch_y, shape.block_threads, shape.rows, shape.stage_from) == (96, 96, 16, 32)
    assert got == depth
    assert (tiled.host_shape.cols, tiled.host_shape.threads) == (1, 1)


def test_a_row_nest_walking_down_a_column_keeps_its_kernel() -> None:
    """``A^T x``: neighbouring threads already read neighbouring elements at each step."""
    verdict, tiled, _ = row_tiling_of(NESTS)["gemv_cols"]
    assert tiled is None
    assert verdict == "the load at +0xa1b does not read along its row (a 1-D kernel's row loads must)"


def test_the_row_stage_depth_follows_the_row_step_and_shared_memory() -> None:
    assert row_shape(4, 4, 4).depth == 64
    assert row_shape(8, 8, 8).depth == 32
    assert row_shape(1, 1, 1).depth == 128
    assert row_shape(24, 24, 8).depth == 32  # 256 // 24 = 10, at least 32
    # two buffers of 64 iterations of 17 rows (16 and the padding) of 24 bytes do not fit
    # 48 KB; of 32 they do; of 32 iterations of 48 bytes they do not
    assert row_shape(4, 12, 0).depth == 64
    assert row_shape(4, 24, 0).depth == 32
    assert row_shape(4, 48, 0) is None


def test_a_kernel_too_large_to_copy_per_cell_is_not_tiled(monkeypatch) -> None:
    import tensorwasm.compiler.tile as tile

    monkeypatch.setattr(tile, "MAX_KERNEL_OPS", 20)
    verdict, tiled = tiling_of(NESTS)["gemm_ab"]
    assert tiled is None and verdict.startswith("the kernel has ") and verdict.endswith("copied per cell")


def test_the_switch_turns_tiling_off_and_is_checked(monkeypatch) -> None:
    monkeypatch.setenv(config.TILING, "off")
    assert tiling_of(NESTS)["gemm_ab"] == ("tiling is off (TENSORWASM_TILING=off)", None)
    monkeypatch.setenv(config.TILING, "maybe")
    with pytest.raises(ConfigError, match="TENSORWASM_TILING='maybe'"):
        config.tiling_enabled()


def test_the_device_model_picks_the_largest_register_block_that_fits() -> None:
    model = DeviceModel()
    gemm = choose_tile(8, 8, 1, (2, 2), model)  # f32 gemm unrolled twice: 2 row and 2 column loads
    assert gemm == TileShape(16, 16, 4, 4, 16)
    # Every choice fits the model: shared memory, registers per thread and per multiprocessor.
    for args in [(8, 8, 1, (2, 2)), (16, 16, 2, (2, 2)), (4, 4, 30, (1, 1)), (64, 64, 1, (8, 8))]:
        shape = choose_tile(*args, model)
        assert shape is not None
        regs = estimated_registers(shape, args[2], *args[3])
        assert shape.shared_bytes(args[0], args[1]) <= model.shared_bytes
        assert regs <= model.max_registers_per_thread and regs * shape.threads <= model.registers_per_sm
    # Many carried words per cell: a smaller register block.
    heavy = choose_tile(4, 4, 30, (1, 1), model)
    assert heavy.cells_x * heavy.cells_y < 16
    # Less shared memory: a shallower stage.
    assert choose_tile(8, 8, 1, (2, 2), DeviceModel(shared_bytes=12 * 1024)).depth == 8
    # Nothing fits: None, and the kernel stays as it is.
    assert choose_tile(4000, 4000, 1, (1, 1), model) is None


def assemble(ptxas: str, ptx: str, stem: Path) -> subprocess.CompletedProcess:
    """ptxas -v on ``ptx`` for sm_90, written beside ``stem``."""
    src = stem.with_suffix(".ptx")
    src.write_text(ptx)
    return subprocess.run(
        [ptxas, "-arch=sm_90", "-v", str(src), "-o", str(stem.with_suffix(".cubin"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_tiled_gemm_kernel_assembles_for_sm_90(ptxas: str, tmp_path: Path, monkeypatch) -> None:
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    preparation = prepare_offload(GEMM.read_bytes())
    tiled_loop = next(lp for lp in preparation.prepared.loops if lp.tile is not None)
    assert tiled_loop.tile == (64, 64, 16, 16)
    ptx = compile_loop_kernels(preparation, target).text
    entry = ptx[ptx.index(f".entry {tiled_loop.entry(True)}(") :]
    assert ".shared .align 16 .b8 tw_shared_" in ptx and "ld.shared" in ptx and "st.shared" in ptx
    assert "barrier.red.or.pred" in ptx and "barrier.sync" in ptx
    assert "fma." not in ptx and ".ftz" not in ptx
    assert "call.uni" in entry  # the entry walks the tiles, calling the tile function
    proc = assemble(ptxas, ptx, tmp_path / "gemm")
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv(config.TILING, "off")
    untiled = compile_loop_kernels(prepare_offload(GEMM.read_bytes()), target).text
    assert "tw_shared_" not in untiled and "barrier.red.or" not in untiled


def test_tiled_gemm_asks_for_two_blocks_per_multiprocessor_and_fits(ptxas: str, tmp_path: Path) -> None:
    """The tiled kernel's launch bounds (its 16 x 16 block, two blocks per multiprocessor)
    make ptxas fit it in 128 registers, so one block computes while the other stages; the
    staging loads are one load each (a misaligned address reads the aligned one below it), with no
    byte-wise call in the staging loop."""
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    preparation = prepare_offload(GEMM.read_bytes())
    tiled_loop = next(lp for lp in preparation.prepared.loops if lp.tile is not None)
    tiled = preparation.state.dialect.module.functions[tiled_loop.kernel_index].attrs["tiled"]
    assert tiled.gpu_blocks == 2
    ptx = compile_loop_kernels(preparation, target, [tiled_loop.kernel_index]).text
    entry = ptx[ptx.index(f".entry {tiled_loop.entry(True)}(") :]
    assert re.search(r"\)\s*\.maxntid 16, 16, 1\s*\.minnctapersm 2\s*\{", entry)
    # Byte-wise loads remain only for the kernel's two gathered loads (the k loop's
    # remainder, at addresses the analysis cannot follow), once per cell: 2 x 16.
    assert ptx.count("call.uni (retval0), tw_load32_bytes") == 2 * 16
    proc = assemble(ptxas, ptx, tmp_path / "gemm")
    assert proc.returncode == 0, proc.stderr
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", proc.stderr)]
    assert registers and max(registers) <= 128, proc.stderr


def test_a_row_tiled_kernel_stages_the_next_stage_while_a_warp_computes(ptxas: str, tmp_path: Path) -> None:
    """gemv's block (16 rows: one warp computes, two stage) meets once a stage, at the vote
    that starts it. After it the staging threads store the next stage into the other shared
    buffer, with the word that says whether it runs in full, and issue the global loads of
    the stage after it, which are in flight while the block computes: the code generator
    has not sunk them to their use (the stores a stage later). The computing warp hints
    its rows' lines for a later stage into the L2 cache, and a full stage's loop runs eight
    iterations a trip, their shared-memory reads in one basic block."""
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    preparation = prepare_offload(NESTS.read_bytes())
    row = next(lp for lp in preparation.prepared.loops if lp.plan.func.name == "gemv_rows" and lp.tile)
    tiled = preparation.state.dialect.module.functions[row.kernel_index].attrs["tiled"]
    assert tiled.gpu_shape.prefetch and not tiled.host_shape.prefetch
    ptx = compile_loop_kernels(preparation, target, [row.kernel_index]).text
    assert ptx.count("barrier.red.or") == 1 and "barrier.sync" not in ptx
    blocks = [
        re.findall(r"^\s*(st\.shared|ld\.shared|ld\.global|prefetch\.global\.L2)", block, re.M)
        for block in re.split(r"^\$L__BB\S*:", ptx, flags=re.M)
    ]
    # 2 row loads (clang unrolled the loop by two) x 32 iterations x 16 rows over 64
    # staging threads, and 2 loads of x (32 iterations: a thread each, the others repeat
    # the last); the stores also write the stage's word. The loads follow in the same block.
    staged = 2 * 32 * 16 // 64 + 2
    assert ["st.shared"] * (staged + 1) + ["ld.global"] * staged in blocks
    # the computing warp's hints for the L2 cache, L2_AHEAD stages ahead: a stage reads 32
    # iterations x 8 bytes of each row load, two 128-byte lines
    (hints,) = [block for block in blocks if "prefetch.global.L2" in block]
    assert hints.count("prefetch.global.L2") == 2 * 2 and "ld.global" not in hints
    assert max(block.count("ld.shared") for block in blocks) == 8 * 4  # 2 row loads and 2 of x
    proc = assemble(ptxas, ptx, tmp_path / "gemv")
    assert proc.returncode == 0 and "bytes spill" in proc.stderr, proc.stderr
    assert all(n == "0" for n in re.findall(r"(\d+) bytes spill", proc.stderr)), proc.stderr


def test_resident_blocks_by_the_device_model() -> None:
    shape = TileShape(16, 16, 4, 4, 16)
    assert resident_blocks(shape, 16 * 1024, 80) == 2
    assert resident_blocks(shape, 16 * 1024, 129) == 1  # two blocks leave 128 registers a thread
    assert resident_blocks(shape, 60 * 1024, 80) == 1  # two blocks' shared memory does not fit
    assert resident_blocks(TileShape(32, 32, 1, 1, 8), 1024, 40) == 1  # 2048 threads > 1024


# -- results equal to wasmtime's ---------------------------------------------------------

# (function, element type, parameter names): sizes are m, n, p; a, b, c arrays.
NEST_CALLS = {
    "gemm_ab": ("f32", ["m", "n", "p", "alpha", "beta", ("a", "mp"), ("b", "pn"), ("c", "mn")]),
    "syrk": ("f64", ["n", "p", ("a", "np"), ("c", "nn")]),
    "imix": ("i32", ["m", "n", "p", ("a", "mp"), ("b", "pn"), ("c", "mn")]),
    # 1-D kernels: a row of p elements per thread (ROW_NESTS)
    "gemv_rows": ("f32", ["m", "p", ("a", "mp"), ("x", "p"), ("y", "m")]),
    "dmv_rows": ("f64", ["m", "p", "alpha", ("a", "mp"), ("x", "p"), ("y", "m")]),
    "irows": ("i32", ["m", "p", ("a", "mp"), ("b", "mp"), ("c", "m")]),
}
ROW_NESTS = frozenset({"gemv_rows", "dmv_rows", "irows"})
SIZES = [(37, 37, 37), (33, 70, 9), (1, 1, 1), (65, 64, 17), (5, 3, 2), (70, 66, 1), (40, 8, 150)]


def _values(rng: random.Random, elem: str, count: int, nans: bool) -> bytes:
    """Values of mixed sign and magnitude, zeros of both signs and subnormals; with
    ``nans``, a few infinities and NaNs of random payloads, quiet and signalling (Wasm's
    result is then any arithmetic NaN; the lowering returns x86's, wasmtime's)."""
    if elem == "i32":
        return b"".join(struct.pack("<i", rng.randrange(-(1 << 31), 1 << 31)) for _ in range(count))
    fmt, tiny, ifmt, bits = ("<f", 1e-40, "<I", 32) if elem == "f32" else ("<d", 1e-310, "<Q", 64)
    specials = [0.0, -0.0, tiny, -tiny, 1.0, -1.0]
    out = []
    for _ in range(count):
        if nans and rng.random() < 0.002:
            exponent = ((1 << (11 if bits == 64 else 8)) - 1) << (52 if bits == 64 else 23)
            payload = rng.randrange(1, 1 << (52 if bits == 64 else 23))
            out.append(struct.pack(ifmt, exponent | payload | (rng.randrange(2) << (bits - 1))))
        elif nans and rng.random() < 0.002:
            out.append(struct.pack(fmt, rng.choice([float("inf"), float("-inf")])))
        else:
            out.append(
                struct.pack(fmt, rng.choice(specials) if rng.random() < 0.1 else rng.uniform(-1000, 1000))
            )
    return b"".join(out)


def run_nest(
    wasm: bytes,
    func: str,
    sizes: tuple[int, int, int],
    seed: int,
    offload=None,
    nans=False,
    last: str | None = None,
) -> bytes:
    """Call ``func`` of the nests module on arrays of random values; the memory after it.
    ``last`` names an array to place at the very end of linear memory (the others from
    64 KiB on), so that a tile's staging, which reads rows past the grid and iterations past
    the loop, reads outside memory."""
    elem, params = NEST_CALLS[func]
    dims = dict(zip("mnp", sizes, strict=True)) | {"n": sizes[1] if func != "syrk" else sizes[0]}
    store, inst = instantiate(wasm, offload)
    exports = inst.exports(store)
    memory = exports["memory"]
    rng = random.Random(seed)
    at, args, arrays = 1 << 16, [], {}
    width = 8 if elem == "f64" else 4
    for param in params:
        if isinstance(param, tuple):
            count = 1
            for d in param[1]:
                count *= dims[d]
            raw = _values(rng, elem, count, nans)
            arrays[param[0]] = (len(args), raw)
            args.append(at)
            at += len(raw) + width * rng.randrange(0, 3)  # arrays not always on a tile's boundary
        elif param in ("alpha", "beta"):
            args.append(rng.choice([1.5, -0.25, 3.0]))
        else:
            args.append(dims[param])
    if last is not None:
        index, raw = arrays[last]
        at = 1 << 16
        for name, (k, other) in arrays.items():
            if name != last:
                args[k] = at
                at += len(other)
        pages = -(-(at + len(raw)) // (1 << 16))
        if pages > memory.size(store):
            memory.grow(store, pages - memory.size(store))
        args[index] = memory.data_len(store) - len(raw)
    for index, raw in arrays.values():
        memory.write(store, raw, args[index])
    exports[func](store, *args)
    return bytes(memory.read(store, 0, memory.data_len(store)))


_OFFLOADS: dict[tuple[str, bool], OffloadModule] = {}


def offload_for(device: str, tiled: bool, monkeypatch) -> OffloadModule:
    key = (device, tiled)
    if key not in _OFFLOADS:
        monkeypatch.setenv(config.TILING, "on" if tiled else "off")
        _OFFLOADS[key] = OffloadModule(NESTS.read_bytes(), device=device, mode="always")
    return _OFFLOADS[key]


def check_nests(device: str, tiled: bool, func: str, monkeypatch) -> None:
    offload = offload_for(device, tiled, monkeypatch)
    nests = [
        lp for lp in offload.loops if lp.plan.func.name == func and (lp.plan.collapse or func in ROW_NESTS)
    ]
    assert [lp.tile is not None for lp in nests] == [tiled]
    before = sum(lp.stats.offloaded for lp in offload.loops)
    for n, sizes in enumerate(SIZES):
        for nans in (False, True):  # NaNs: the engine's tiles redone by the cells' own code
            expected = run_nest(NESTS.read_bytes(), func, sizes, seed=n, nans=nans)
            got = run_nest(offload.rewritten, func, sizes, seed=n, offload=offload, nans=nans)
            assert got == expected, (sizes, nans)
    large = 2 * sum(m * n >= 100 for m, n, _ in SIZES)  # the smallest may stay on wasmtime
    assert sum(lp.stats.offloaded for lp in offload.loops) >= before + large


@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("func", sorted(NEST_CALLS))
def test_tiled_nests_match_wasmtime_on_the_host(func: str, tiled: bool, monkeypatch) -> None:
    check_nests("cpu", tiled, func, monkeypatch)


# (function, the array placed at the end of memory): the row loads' array of each 1-D nest,
# and gemm's row and column arrays
AT_THE_END = [("gemv_rows", "a"), ("dmv_rows", "a"), ("irows", "b"), ("gemm_ab", "a"), ("gemm_ab", "b")]


def check_at_the_end(device: str, func: str, last: str, monkeypatch) -> None:
    """A tiled nest whose staged array ends where linear memory does: the stages read past
    the grid's last row and the loop's last iteration, outside memory (address 0 instead),
    and no cell uses those values: memory equals wasmtime's."""
    offload = offload_for(device, True, monkeypatch)
    launched = sum(lp.stats.offloaded for lp in offload.loops)
    for n, sizes in enumerate(SIZES):
        expected = run_nest(NESTS.read_bytes(), func, sizes, seed=n, nans=n % 2 == 1, last=last)
        got = run_nest(offload.rewritten, func, sizes, seed=n, offload=offload, nans=n % 2 == 1, last=last)
        assert got == expected, sizes
    large = sum(m * n >= 100 for m, n, _ in SIZES)  # the smallest may stay on wasmtime
    assert sum(lp.stats.offloaded for lp in offload.loops) >= launched + large


@pytest.mark.parametrize(("func", "last"), AT_THE_END)
def test_tiles_staging_past_the_end_of_memory_match_wasmtime_on_the_host(func, last, monkeypatch) -> None:
    check_at_the_end("cpu", func, last, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize(("func", "last"), AT_THE_END)
def test_tiles_staging_past_the_end_of_memory_match_wasmtime_on_the_gpu(func, last, monkeypatch) -> None:
    check_at_the_end("gpu", func, last, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("func", sorted(NEST_CALLS))
def test_tiled_nests_match_wasmtime_on_the_gpu(func: str, tiled: bool, monkeypatch) -> None:
    check_nests("gpu", tiled, func, monkeypatch)


def run_program(path: Path, argv: list[str], tmp_path: Path, device: str | None) -> str:
    """A WASI program's output, on wasmtime (``device`` None) or offloaded to ``device``."""
    import tensorwasm

    wasm = path.read_bytes()
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = argv
    out = tmp_path / f"out-{device}-{len(list(tmp_path.iterdir()))}"
    wasi.stdout_file = str(out)
    store.set_wasi(wasi)
    if device is None:
        instance = linker.instantiate(store, wasmtime.Module(engine, wasm))
    else:
        instance = tensorwasm.instantiate(store, wasm, linker=linker, device=device, offload="always")
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as exc:
        assert exc.code == 0
    if device is not None:
        assert sum(loop.offloaded for loop in tensorwasm.report(instance).loops) > 0
    return out.read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("tiled", ["on", "off"])
@pytest.mark.parametrize(("path", "n"), [(GEMM, "37"), (GEMM, "1000"), (MATMUL, "37"), (MATMUL, "1000")])
def test_gemm_programs_print_what_wasmtime_prints_on_the_gpu(path: Path, n: str, tiled: str, tmp_path,
                                                             monkeypatch) -> None:  # fmt: skip
    monkeypatch.setenv(config.TILING, tiled)
    argv = [path.stem.split(".")[0], n]
    # gemm prints a checksum of C's bits, so equal output is equal memory for C.
    assert run_program(path, argv, tmp_path, "gpu") == run_program(path, argv, tmp_path, None)
