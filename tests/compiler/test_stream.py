"""Streaming kernels (compiler.stream): a chunk of iterations per thread, every iteration's
loads before the chunk's stores, each iteration's own accesses in Wasm's order; the same
memory as wasmtime on the host (and the GPU), including arrays that meet within one
iteration and trip counts that leave part of a chunk."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions
from tensorwasm.compiler.prepare import prepare_offload
from tensorwasm.compiler.rewrite import HOST_MODULE
from tensorwasm.compiler.stream import ITERATIONS_PER_THREAD
from tensorwasm.compiler.target import ARCHES
from tensorwasm.dialect.types import F32, I32
from tensorwasm.runtime.guards import Launch
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import BLOCK_THREADS, launch_grid
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import SAXPY, assemble, kernels, loop_kernels_ptx
from tests.conftest import wat

# Two stores per iteration, the second reading back what the first wrote:
# a[i] = 2 * x[i]; b[i] = a[i] + y[i] (f32 arrays at a, b, x, y).
TWO_STORES = """(module (memory (export "memory") 4)
  (func (export "run") (param $n i32) (param $a i32) (param $b i32) (param $x i32) (param $y i32)
    (local $i i32) (local $o i32)
    (loop $l
      (local.set $o (i32.shl (local.get $i) (i32.const 2)))
      (f32.store (i32.add (local.get $a) (local.get $o))
        (f32.mul (f32.const 2) (f32.load (i32.add (local.get $x) (local.get $o)))))
      (f32.store (i32.add (local.get $b) (local.get $o))
        (f32.add (f32.load (i32.add (local.get $a) (local.get $o)))
                 (f32.load (i32.add (local.get $y) (local.get $o)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""

NOT_STREAMING = """(module (memory (export "memory") 1)
  (func (export "divide") (param $n i32) (param $d i32) (local $i i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2))
        (i32.div_u (i32.load (i32.shl (local.get $i) (i32.const 2))) (local.get $d)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func (export "rows") (param $n i32) (param $m i32) (local $i i32) (local $j i32) (local $s i32)
    (loop $l
      (local.set $j (i32.const 0))
      (local.set $s (i32.const 0))
      (loop $k
        (local.set $s (i32.add (local.get $s)
          (i32.load (i32.add (i32.shl (local.get $i) (i32.const 6)) (i32.shl (local.get $j) (i32.const 2))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $k (i32.lt_u (local.get $j) (local.get $m))))
      (i32.store (i32.add (i32.const 32768) (i32.shl (local.get $i) (i32.const 2))) (local.get $s))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def _streams(text: str) -> dict[str, object]:
    """Each offloaded loop's outermost kernel by function name: (its PreparedLoop, its
    stream function or None)."""
    prep = prepare_offload(wat(text))
    module = prep.state.dialect.module
    out = {}
    for lp in prep.prepared.loops:
        kernel = module.functions[lp.kernel_index]
        streaming = kernel.attrs.get("streaming")
        if lp.plan.loop.depth == 1:
            out[lp.plan.func.name] = (lp, module.functions[streaming.index] if streaming else None)
    return out


# clang's two-way unrolled saxpy (-O2, wasm32): y[2i] = a * x[2i] + y[2i], then the same
# at 2i + 1, whose loads follow the first store.
UNROLLED = """(module (memory (export "memory") 4)
  (func (export "saxpy2") (param $n i32) (param $a f32) (param $x i32) (param $y i32)
    (local $i i32) (local $o i32)
    (loop $l
      (local.set $o (i32.shl (local.get $i) (i32.const 3)))
      (f32.store (i32.add (local.get $y) (local.get $o))
        (f32.add (f32.mul (local.get $a) (f32.load (i32.add (local.get $x) (local.get $o))))
                 (f32.load (i32.add (local.get $y) (local.get $o)))))
      (f32.store offset=4 (i32.add (local.get $y) (local.get $o))
        (f32.add (f32.mul (local.get $a) (f32.load offset=4 (i32.add (local.get $x) (local.get $o))))
                 (f32.load offset=4 (i32.add (local.get $y) (local.get $o)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


# The same with a square root: y[2i] = sqrt(x[2i]), then the same at 2i + 1.
UNROLLED_SQRT = """(module (memory (export "memory") 4)
  (func (export "roots2") (param $n i32) (param $x i32) (param $y i32) (local $i i32) (local $o i32)
    (loop $l
      (local.set $o (i32.shl (local.get $i) (i32.const 3)))
      (f32.store (i32.add (local.get $y) (local.get $o))
        (f32.sqrt (f32.load (i32.add (local.get $x) (local.get $o)))))
      (f32.store offset=4 (i32.add (local.get $y) (local.get $o))
        (f32.sqrt (f32.load offset=4 (i32.add (local.get $x) (local.get $o)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def _kinds(stream) -> str:
    return "".join({"mem.load": "L", "mem.store": "S"}.get(op.name, "") for op in stream.ops())


def test_each_iterations_accesses_keep_their_order_and_loads_come_first() -> None:
    """Level by level: the four iterations' loads of x and y (y's passes the store of a:
    live-ins keep them apart, a guard), their stores of a, then their loads of a (after
    their own store of a: the same address), then their stores of b."""
    ((lp, stream),) = _streams(TWO_STORES).values()
    assert lp.per_thread == ITERATIONS_PER_THREAD and stream is not None
    n = ITERATIONS_PER_THREAD
    assert _kinds(stream) == "L" * 2 * n + "S" * n + "L" * n + "S" * n
    accesses = lp.plan.accesses
    a_store = next(n for n, a in enumerate(accesses) if a.store)
    (y_load,) = (n for n, a in enumerate(accesses) if n > a_store and not a.store
                 and a.address != accesses[a_store].address)  # fmt: skip
    assert lp.plan.row_guarded == [(a_store, y_load)]


def test_loads_pass_their_iterations_stores_they_never_meet_and_its_stores_leave_together() -> None:
    """Unrolled saxpy: every load of the chunk first; then each iteration's two stores one
    after the other. y[2i + 1]'s load passes the store of y[2i] (4 bytes on: the analysis
    settles it); x[2i + 1]'s passes it under a guard."""
    ((lp, stream),) = _streams(UNROLLED).values()
    n = ITERATIONS_PER_THREAD
    assert lp.per_thread == n and _kinds(stream) == "L" * 4 * n + "S" * 2 * n
    stores = [op for op in stream.ops() if op.name == "mem.store"]
    assert [op.attrs.get("offset", 0) for op in stores] == [0, 4] * n
    accesses = lp.plan.accesses
    ((s, a),) = lp.plan.row_guarded
    assert accesses[s].store and accesses[s].address.constant == 0
    assert not accesses[a].store and accesses[a].address.constant == 4
    assert accesses[a].address.symbols() != accesses[s].address.symbols()


def test_kernels_that_may_trap_or_loop_inside_keep_one_iteration_per_thread() -> None:
    found = _streams(NOT_STREAMING)
    assert sorted(found) == ["divide", "rows"] and all(
        stream is None and lp.per_thread == 1 for lp, stream in found.values()
    )


# condmap's body: y[i] = x[i] > 0 ? sqrt(x[i]) * 2 : x[i] * x[i] - 0.25 (a select, as clang
# leaves it), and the same with a division.
LONG = """(module (memory (export "memory") 4)
  (func (export "condmap") (param $n i32) (local $i i32) (local $o i32) (local $x f32)
    (loop $l
      (local.set $o (i32.shl (local.get $i) (i32.const 2)))
      (local.set $x (f32.load (local.get $o)))
      (f32.store offset=65536 (local.get $o)
        (select (f32.mul (f32.sqrt (local.get $x)) (f32.const 2))
                (f32.sub (f32.mul (local.get $x) (local.get $x)) (f32.const 0.25))
                (f32.gt (local.get $x) (f32.const 0))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func (export "ratio") (param $n i32) (local $i i32) (local $o i32)
    (loop $l
      (local.set $o (i32.shl (local.get $i) (i32.const 2)))
      (f32.store offset=65536 (local.get $o) (f32.div (f32.load (local.get $o)) (f32.const 3)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def test_a_body_with_square_roots_streams_one_iteration_a_call_where_a_load_passes_a_store() -> None:
    """Unrolled square roots: one iteration a thread, both loads before both stores."""
    ((lp, stream),) = _streams(UNROLLED_SQRT).values()
    assert lp.per_thread == 1 and stream is not None and _kinds(stream) == "LLSS"
    ((s, a),) = lp.plan.row_guarded
    assert lp.plan.accesses[s].store and not lp.plan.accesses[a].store


def test_bodies_with_square_roots_or_divisions_keep_one_iteration_per_thread() -> None:
    found = _streams(LONG)
    assert sorted(found) == ["condmap", "ratio"] and all(
        stream is None and lp.per_thread == 1 for lp, stream in found.values()
    )
    ((lp, stream),) = _streams(SAXPY).values()  # a streaming body still streams
    assert stream is not None and lp.per_thread == ITERATIONS_PER_THREAD


@pytest.mark.parametrize("arch", ARCHES)
def test_a_chunks_loads_are_all_issued_before_its_first_store(arch: str, ptxas: str, tmp_path: Path) -> None:
    """saxpy's entry: the 2 loads of each of the chunk's iterations precede its first store
    (one iteration per thread issued 2 loads, then stored), and the PTX assembles."""
    ptx = loop_kernels_ptx(SAXPY, arch)
    assemble(ptxas, ptx, arch, tmp_path)
    ((_, body),) = kernels(ptx).items()
    first_store = body.index("st.global")
    loads = re.findall(r"\bld\.global\.b32", body[:first_store])  # linear memory (not the .nc context)
    assert len(loads) == 2 * ITERATIONS_PER_THREAD


@pytest.mark.parametrize("arch", ARCHES)
def test_unrolled_saxpys_chunk_loads_all_then_tests_once_then_stores_all(
    arch: str, ptxas: str, tmp_path: Path
) -> None:
    """The unrolled saxpy's entry, in the chunk's loop: its 16 loads, then one NaN test of
    the 8 values (one branch), then its 8 stores one after the other, no branch among them:
    each sector's two halves leave the thread together."""
    ptx = loop_kernels_ptx(UNROLLED, arch)
    assemble(ptxas, ptx, arch, tmp_path)
    ((_, body),) = kernels(ptx).items()
    lines = [line.strip() for line in body.splitlines()]
    stores = [n for n, line in enumerate(lines) if line.startswith("st.global")]
    loads = [n for n, line in enumerate(lines) if re.match(r"ld\.global\.b32", line)]
    branches = [n for n, line in enumerate(lines) if re.match(r"@%p\d+ bra", line)]
    chunk_stores = stores[: 2 * ITERATIONS_PER_THREAD]
    assert len(loads) >= 4 * ITERATIONS_PER_THREAD
    assert max(loads[: 4 * ITERATIONS_PER_THREAD]) < min(b for b in branches if b > loads[0])
    assert not [b for b in branches if chunk_stores[0] < b < chunk_stores[-1]]
    assert chunk_stores[-1] - chunk_stores[0] < 8 * len(chunk_stores)


def test_the_launch_has_per_thread_times_fewer_blocks() -> None:
    launch = Launch(1_000_000, {}, [], [])
    grid, block = launch_grid(launch, per_thread=ITERATIONS_PER_THREAD)
    assert block == (BLOCK_THREADS, 1, 1)
    assert grid == (-(-1_000_000 // (BLOCK_THREADS * ITERATIONS_PER_THREAD)), 1, 1)
    assert launch_grid(launch)[0] == (-(-1_000_000 // BLOCK_THREADS), 1, 1)


def _offloaded(wasm: bytes, device: str):
    offload = OffloadModule(wasm, device=device, mode="always", options=AnalysisOptions())

    def host_funcs(store):
        return {(HOST_MODULE, name): f for name, f in offload.host_functions(store).items()}

    return offload, ReferenceInstance(offload.rewritten, host_funcs)


def _with_data(text: str, offsets: list[int], count: int) -> str:
    """``text`` with ``count`` f32 patterns at each of ``offsets``: NaNs with payloads
    (signalling too), infinities, subnormals, signed zeros and ordinary numbers."""
    patterns = [
        0x7FA00001,
        0xFFC00123,
        0x7F800000,
        0x00000001,
        0x80000000,
        0x3FC00000,
        0xC0490FDB,
        0x4B000001,
    ]
    segments = []
    for at in offsets:
        words = ((patterns[i % 8] ^ ((i + at) * 0x9E3779B1 & 0x7FF)) & 0xFFFFFFFF for i in range(count))
        data = "".join(f"\\{b:02x}" for w in words for b in w.to_bytes(4, "little"))
        segments.append(f'(data (i32.const {at}) "{data}")')
    return text[: text.rindex(")")] + "\n".join(segments) + ")"


CASES = [
    # (module, export, args): n leaves part of a chunk; x == y meets within one iteration
    (SAXPY, "saxpy", [(I32, 1003), (F32, 0x3FC00000), (I32, 16), (I32, 8192)]),
    (SAXPY, "saxpy", [(I32, 1001), (F32, 0xBF800000), (I32, 4000), (I32, 4000)]),
    (TWO_STORES, "run", [(I32, 2046), (I32, 0), (I32, 65536), (I32, 131072), (I32, 196608)]),
    (TWO_STORES, "run", [(I32, 7), (I32, 64), (I32, 1024), (I32, 64), (I32, 2048)]),
    (UNROLLED, "saxpy2", [(I32, 1003), (F32, 0x3FC00000), (I32, 16), (I32, 8192)]),
    (UNROLLED, "saxpy2", [(I32, 1001), (F32, 0xBF800000), (I32, 4000), (I32, 4000)]),
    (UNROLLED_SQRT, "roots2", [(I32, 1003), (I32, 16), (I32, 8192)]),
    (UNROLLED_SQRT, "roots2", [(I32, 1001), (I32, 4000), (I32, 4000)]),
]
DATA_AT = [0, 8192, 65536, 131072, 196608]


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(
    ("text", "export", "args"),
    CASES,
    ids=[
        "saxpy-part-chunk",
        "saxpy-x-is-y",
        "two-stores",
        "two-stores-a-is-x",
        "unrolled",
        "unrolled-x-is-y",
        "roots",
        "roots-x-is-y",
    ],
)
def test_streaming_kernels_match_wasmtime(device: str, text: str, export: str, args: list) -> None:
    data = wat(_with_data(text, DATA_AT if text is TWO_STORES else DATA_AT[:2], 2048))
    offload, instance = _offloaded(data, device)
    reference = ReferenceInstance(data)
    assert instance.call(export, args) == reference.call(export, args)
    assert instance.memory("memory") == reference.memory("memory")
    ran = [lp for lp in offload.loops if lp.stats.offloaded]
    expected = 1 if text is UNROLLED_SQRT else ITERATIONS_PER_THREAD
    assert len(ran) == 1 and ran[0].per_thread == expected, "the streaming kernel did not run"
    offload.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_load_that_meets_a_store_of_its_own_iteration_keeps_the_loop_on_the_cpu(device: str) -> None:
    """TWO_STORES with y == a: b[i] = a[i] + y[i] reads what the iteration just stored. The
    stream would load y before that store, so the guard refuses the launch and wasmtime's
    memory comes out of the CPU's run."""
    data = wat(_with_data(TWO_STORES, DATA_AT, 2048))
    args = [(I32, 2046), (I32, 65536), (I32, 131072), (I32, 0), (I32, 65536)]
    offload, instance = _offloaded(data, device)
    reference = ReferenceInstance(data)
    assert instance.call("run", args) == reference.call("run", args)
    assert instance.memory("memory") == reference.memory("memory")
    (lp,) = offload.loops
    assert not lp.stats.offloaded
    assert any("within one iteration" in reason for reason in lp.stats.declined), lp.stats.declined
    offload.close()
