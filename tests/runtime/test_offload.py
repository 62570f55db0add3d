"""Offloaded loops leave memory and results exactly as wasmtime's run of the original loop,
over random sizes, placements (overlapping ones too) and data; on the host backend in CI
and on the GPU (marker gpu)."""

from __future__ import annotations

import os

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import SPECS, Case, module_bytes, run_case

LEVELS = ["O1", "O2"]
CASES = [(mod, func, level) for mod, funcs in SPECS.items() for func in funcs for level in LEVELS]
_MODULES: dict[tuple[str, str, str], OffloadModule] = {}


def prepared(mod: str, level: str, device: str) -> OffloadModule:
    key = (mod, level, device)
    if key not in _MODULES:
        _MODULES[key] = OffloadModule(module_bytes(mod, level), device=device)
    return _MODULES[key]


@st.composite
def cases(draw, spec: list) -> Case:
    names = {p for p in spec if isinstance(p, str) and p in "mnk"}
    dims = {"n": 300} if names == {"n"} else {"m": 24, "n": 24, "k": 10}
    sizes = {name: draw(st.integers(0, dims.get(name, 24))) for name in "mnk"}
    arrays = sum(1 for p in spec if isinstance(p, tuple))
    gap = st.one_of(st.integers(0, 64), st.integers(-64, -1), st.sampled_from([0, 1, 2, 3]))
    gaps = [draw(gap) for _ in range(arrays)]
    scalars = [draw(st.floats(-4, 4, width=32)) for _ in spec]
    return Case(sizes, scalars, gaps, draw(st.integers(0, 2**32)))


def check(mod: str, func: str, level: str, device: str, case: Case) -> None:
    wasm = module_bytes(mod, level)
    spec = SPECS[mod][func]
    offload = prepared(mod, level, device)
    expected = run_case(wasm, func, spec, case)
    actual = run_case(offload.rewritten, func, spec, case, offload)
    assert actual[0] == expected[0]
    if actual[1] != expected[1]:  # (not an assert of the bytes: pytest's diff of megabytes takes minutes)
        at = next((i for i, (x, y) in enumerate(zip(actual[1], expected[1])) if x != y), None)
        where = (
            f"first at byte {at}" if at is not None else f"{len(actual[1])} against {len(expected[1])} bytes"
        )
        pytest.fail(f"linear memory differs from wasmtime's: {where}")


@pytest.mark.parametrize(("mod", "func", "level"), CASES, ids=[f"{f}.{lv}" for _, f, lv in CASES])
@settings(
    max_examples=int(os.environ.get("OFFLOAD_EXAMPLES", 25)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_offload_matches_wasmtime_on_host(mod: str, func: str, level: str, data) -> None:
    check(mod, func, level, "cpu", data.draw(cases(SPECS[mod][func])))


@pytest.mark.gpu
@pytest.mark.parametrize(("mod", "func", "level"), CASES, ids=[f"{f}.{lv}" for _, f, lv in CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_offload_matches_wasmtime_on_gpu(mod: str, func: str, level: str, data) -> None:
    check(mod, func, level, "gpu", data.draw(cases(SPECS[mod][func])))


PARALLEL = [
    ("blas1", "saxpy"), ("blas1", "daxpy"), ("blas1", "sscal"), ("blas1", "idot"),
    ("maps", "relu"), ("maps", "clamp"), ("maps", "abs_or_double"),
    ("reductions", "isum"), ("reductions", "imin"), ("reductions", "imax"), ("reductions", "ixor"),
    ("stencil", "jacobi1d"), ("blas2", "sgemv"), ("blas3", "sgemm"), ("stencil", "jacobi2d"),
]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("mod", "func"), PARALLEL)
def test_parallel_loop_is_offloaded(mod: str, func: str, device: str) -> None:
    level = "O1" if func in ("sgemv", "sgemm") else "O2"
    offload = prepared(mod, level, device)
    spec = SPECS[mod][func]
    case = Case({"n": 64, "m": 9, "k": 5}, [1.5] * len(spec), [0] * len(spec), seed=7)
    expected = run_case(module_bytes(mod, level), func, spec, case)
    before = sum(lp.stats.offloaded for lp in offload.loops)
    actual = run_case(offload.rewritten, func, spec, case, offload)
    assert actual == expected
    assert sum(lp.stats.offloaded for lp in offload.loops) > before, "no loop ran as a kernel"


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_collapsed_nest_runs_as_a_2d_launch(device: str, monkeypatch) -> None:
    import tensorwasm.runtime.guards as guards_module

    offload = prepared("blas3", "O2", device)
    spec = SPECS["blas3"]["sgemm"]
    case = Case({"m": 33, "n": 70, "k": 9}, [0.0] * len(spec), [0, 8, 16], seed=9)
    launches = []
    real_check = guards_module.check
    monkeypatch.setattr(
        guards_module, "check", lambda *a, **k: launches.append(real_check(*a, **k)) or launches[-1]
    )
    assert run_case(offload.rewritten, "sgemm", spec, case, offload) == run_case(
        module_bytes("blas3", "O2"), "sgemm", spec, case
    )
    assert [(lc.trip, lc.nest) for lc in launches] == [(33, (70,))]


def test_aliased_arrays_fall_back_to_the_cpu() -> None:
    offload = prepared("blas1", "O2", "cpu")
    spec = SPECS["blas1"]["saxpy"]
    # y starts 4 bytes into x: the store to y[i] overlaps the read of x[i+1].
    case = Case({"n": 50}, [2.0, 0.0], [0, -196], seed=3)
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    saxpy = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    declined = sum(saxpy.stats.declined.values())
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert sum(saxpy.stats.declined.values()) == declined + 1
    assert any("overlap" in reason for reason in saxpy.stats.declined)


@pytest.mark.parametrize(
    ("mod", "func"), [("blas1", "saxpy"), ("reductions", "isum"), ("reductions", "imin")]
)
def test_large_loops_use_host_threads(mod: str, func: str) -> None:
    offload = OffloadModule(module_bytes(mod, "O2"), device="cpu")
    spec = SPECS[mod][func]
    case = Case({"n": 100_000}, [0.5] * len(spec), [0] * len(spec), seed=11)
    assert run_case(offload.rewritten, func, spec, case, offload) == run_case(
        module_bytes(mod, "O2"), func, spec, case
    )
    loop = next(lp for lp in offload.loops if lp.plan.func.name == func and lp.stats.offloaded)
    assert loop.stats.threads == min(2, os.cpu_count() or 1)


def _saxpy_case(n: int = 4096) -> tuple[list, Case]:
    spec = SPECS["blas1"]["saxpy"]
    return spec, Case({"n": n}, [1.5, 0.0], [0, 0], seed=5)


@pytest.mark.gpu
def test_gpu_copies_are_page_locked() -> None:
    offload = OffloadModule(module_bytes("blas1", "O2"), device="gpu", pin=True)
    spec, case = _saxpy_case()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(
        module_bytes("blas1", "O2"), "saxpy", spec, case
    )
    loop = next(lp for lp in offload.loops if lp.stats.offloaded)
    assert loop.stats.pinned, "linear memory was not page-locked for the copies"
    offload.close()
    assert offload.mirror.pinned is None and offload.mirror.allocator.used == 0


def _saxpy_256(store, instance, a: float, data: bytes) -> bytes:
    """blas1's saxpy over 256 floats, x and y from ``data``: the memory it leaves."""
    exports = instance.exports(store)
    base = exports["scratch_base"](store)
    exports["memory"].write(store, data, base)
    exports["saxpy"](store, 256, a, base, base + 1024)
    return exports["memory"].read(store, base, base + 2048)


def _pinned_offload(wasm: bytes, device: str) -> OffloadModule:
    """``wasm`` prepared to launch from page-locked memory on the GPU, or on the simulated
    device ("simulated")."""
    from tensorwasm.oracle.simulated import SimulatedDevice

    return OffloadModule(wasm, device=SimulatedDevice() if device == "simulated" else "gpu", pin=True)


def _blas1_pair(device: str):
    """blas1 prepared by :func:`_pinned_offload`, an instance of it and one of the plain
    module: (offload, (store, ours), (store, plain))."""
    from tests.offload_cases import instantiate

    wasm = module_bytes("blas1", "O2")
    offload = _pinned_offload(wasm, device)
    return offload, instantiate(offload.rewritten, offload), instantiate(wasm)


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_repeated_launches_replay_one_recorded_graph_with_exact_results(device: str) -> None:
    import random
    import struct

    offload, (store, ours), (plain_store, plain) = _blas1_pair(device)
    rng = random.Random(7)
    try:
        for a in (1.5, 1.5, 1.5, -2.0, -2.0, 1.5):  # new data each call; `a` changes the arguments
            data = struct.pack("<512f", *(rng.uniform(-4, 4) for _ in range(512)))
            assert _saxpy_256(store, ours, a, data) == _saxpy_256(plain_store, plain, a, data)
        loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
        assert loop.stats.offloaded == 6 and loop.stats.pinned
        mirror = offload.mirror
        assert not mirror.graphs_off, "recording the launch as a graph failed"
        # One graph per set of live-ins (the kernel takes them by value, and a recording keeps
        # them) and of steps (the scratch image uploaded or already there), recorded at the
        # set's second launch: the first of each of the two sets is queued step by step.
        assert 1 <= len(mirror._graphs) <= 3
        if device == "simulated":
            assert sum(graph.launches for graph in mirror._graphs.values()) == 4
        # A launch whose arguments were on the device already is replayable: the third call's
        # was replayed, and of the last two sets of arguments, the one whose launch found them
        # there (-2.0, the second time) can be; the last (1.5) uploaded its own again.
        (ready,) = offload.planner.guard_cache[loop.kernel_index].values()
        assert [bool(arrival.replay) for arrival in ready._arrivals.values()] == [False, True]
        assert loop.stats.replayed == 1
    finally:
        offload.close()


def _counting_guards(offload: OffloadModule, monkeypatch) -> list[int]:
    """Count the arrivals that take the whole path (the guards' lookup) from now on."""
    calls = [0]
    whole = offload.planner.guards

    def guards(*args):
        calls[0] += 1
        return whole(*args)

    monkeypatch.setattr(offload.planner, "guards", guards)
    return calls


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_an_arrival_like_the_last_replays_at_once_and_any_change_takes_the_whole_path(
    device: str, monkeypatch
) -> None:
    import random
    import struct

    offload, (store, ours), (plain_store, plain) = _blas1_pair(device)
    whole = _counting_guards(offload, monkeypatch)
    rng = random.Random(11)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")

    def call(a: float) -> None:
        data = struct.pack("<512f", *(rng.uniform(-4, 4) for _ in range(512)))
        assert _saxpy_256(store, ours, a, data) == _saxpy_256(plain_store, plain, a, data)

    try:
        for _ in range(5):
            call(1.5)
        # The first two take the whole path (the second records the replayable launch).
        assert whole[0] == 2 and loop.again
        call(-2.0)  # other live-ins
        assert whole[0] == 3
        for store_, instance in ((store, ours), (plain_store, plain)):
            instance.exports(store_)["memory"].grow(store_, 1)
        call(-2.0)  # the same live-ins, a larger memory: the guards decide again
        assert whole[0] == 4
        for _ in range(3):
            call(-2.0)
        assert whole[0] == 5, "the launch after the memory grew was not replayed"
        assert loop.stats.offloaded == loop.stats.arrivals == 10 and not loop.stats.declined
    finally:
        offload.close()


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_grown_memory_is_page_locked_piece_by_piece_and_copies_across_pieces_are_exact(device: str) -> None:
    import random
    import struct

    from tensorwasm.runtime.mirror import DeviceMirror

    offload, (store, ours), (plain_store, plain) = _blas1_pair(device)
    rng = random.Random(5)
    runs = ((store, ours), (plain_store, plain))

    def saxpy(x: int, y: int) -> None:
        data = struct.pack("<512f", *(rng.uniform(-4, 4) for _ in range(512)))
        results = []
        for store_, instance in runs:
            exports = instance.exports(store_)
            exports["memory"].write(store_, data[:1024], x)
            exports["memory"].write(store_, data[1024:], y)
            exports["saxpy"](store_, 256, 1.5, x, y)
            results.append(bytes(exports["memory"].read(store_, 0, exports["memory"].data_len(store_))))
        assert results[0] == results[1]

    try:
        memory = ours.exports(store)["memory"]
        base = ours.exports(store)["scratch_base"](store)
        saxpy(base, base + 1024)
        mirror = offload.mirror
        first = memory.data_len(store)
        assert mirror.pinned[1] == first and mirror.pieces == [0]
        ends = [first]
        for _ in range(DeviceMirror.PIECES_KEPT - 1):
            for store_, instance in runs:
                instance.exports(store_)["memory"].grow(store_, 1)
            end = ends[-1]
            saxpy(end - 512, end + 512)  # x across the last piece's end, y in the new pages
            ends.append(memory.data_len(store))
            assert mirror.pinned[1] == ends[-1]
        assert mirror.pieces == [0, *ends[:-1]]  # each growth's pages registered on their own
        for store_, instance in runs:  # one more piece than kept: page-locked again as one
            instance.exports(store_)["memory"].grow(store_, 1)
        saxpy(ends[-1] - 512, ends[-1] + 512)
        assert mirror.pieces == [0] and mirror.pinned[1] == memory.data_len(store)
        host, size = mirror.pinned
    finally:
        offload.close()
    assert offload.mirror.pinned is None
    assert offload.mirror.context.locks.pieces(host, size) == [(0, size)]  # every registration undone


DIVIDE_LOOP = """(module (memory (export "memory") 1)
  (func (export "divide") (param $n i32) (local $i i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2))
        (i32.div_s (i32.const 1000000) (i32.load offset=8192 (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def divide(runs, divisors: list[int]) -> list[tuple[bytes, wasmtime.TrapCode | None]]:
    """DIVIDE_LOOP's ``divide`` over ``divisors`` in each (store, instance) of ``runs``: the
    memory each leaves, and its trap, if any."""
    import struct

    outcomes = []
    for store, instance in runs:
        exports = instance.exports(store)
        exports["memory"].write(store, struct.pack(f"<{len(divisors)}i", *divisors), 8192)
        try:
            exports["divide"](store, len(divisors))
            trap = None
        except wasmtime.Trap as exc:
            trap = exc.trap_code
        outcomes.append((bytes(exports["memory"].read(store, 0, 4096)), trap))
    return outcomes


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_replayed_launch_that_traps_leaves_the_loop_to_wasmtime_and_its_trap(
    device: str, monkeypatch
) -> None:

    from tests.conftest import wat
    from tests.offload_cases import instantiate

    wasm = wat(DIVIDE_LOOP)
    offload = _pinned_offload(wasm, device)
    whole = _counting_guards(offload, monkeypatch)
    (loop,) = offload.loops
    runs = [instantiate(offload.rewritten, offload), instantiate(wasm)]

    def call(divisors: list[int]) -> list[tuple[bytes, wasmtime.TrapCode | None]]:
        return divide(runs, divisors)

    try:
        divisors = list(range(1, 513))
        for _ in range(3):
            ours, plain = call(divisors)
            assert ours == plain and ours[1] is None
        assert whole[0] == 2 and loop.again
        divisors[300] = 0  # the same live-ins; the replayed kernel divides by zero
        ours, plain = call(divisors)
        assert ours == plain and ours[1] == wasmtime.TrapCode.INTEGER_DIVISION_BY_ZERO
        assert not loop.again and whole[0] == 2
        divisors[300] = 7
        ours, plain = call(divisors)  # the whole path again, and offloaded
        assert ours == plain and ours[1] is None and whole[0] == 3
        assert loop.stats.offloaded == 4 and sum(loop.stats.declined.values()) == 1
    finally:
        offload.close()


def test_a_recorded_launch_that_fails_runs_on_the_cpu_or_step_by_step(monkeypatch) -> None:
    import random
    import struct

    from tensorwasm.oracle.simulated import HostGraph, SimulatedDevice
    from tensorwasm.runtime.driver import CudaError
    from tests.offload_cases import instantiate

    wasm = module_bytes("blas1", "O2")
    offload = OffloadModule(wasm, device=SimulatedDevice(), pin=True)
    failures = {"left": 0}
    replay = HostGraph.launch

    def flaky(graph: HostGraph, stream: int = 0) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise CudaError("cuGraphLaunch", 1)  # CUDA_ERROR_INVALID_VALUE: nothing sticky
        replay(graph, stream)

    monkeypatch.setattr(HostGraph, "launch", flaky)
    store, ours = instantiate(offload.rewritten, offload)
    plain_store, plain = instantiate(wasm)
    rng = random.Random(3)
    for call in range(8):
        # Call 3 fails as a replay (the arrival runs on wasmtime); call 5 as a freshly
        # recorded launch (its steps are queued one by one instead).
        failures["left"] = int(call in (3, 5))
        data = struct.pack("<512f", *(rng.uniform(-4, 4) for _ in range(512)))
        assert _saxpy_256(store, ours, 1.5, data) == _saxpy_256(plain_store, plain, 1.5, data), call
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 7
    ((reason, count),) = loop.stats.declined.items()
    assert "cuGraphLaunch" in reason and count == 1
    offload.close()


@pytest.mark.gpu
def test_over_the_device_memory_cap_the_loop_runs_on_the_cpu(caplog) -> None:
    capped = OffloadModule(module_bytes("blas1", "O2"), device="gpu", device_memory_limit=64 << 10)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    for _ in range(2):  # warned once, declined each time, results exact
        assert run_case(capped.rewritten, "saxpy", spec, case, capped) == expected
    loop = next(lp for lp in capped.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 0
    ((reason, count),) = loop.stats.declined.items()
    assert "device memory cap" in reason and count == 2
    assert sum("runs on the CPU" in r.message for r in caplog.records) == 1
    assert capped.mirror.allocator.used == 0  # nothing reached the driver
    roomy = OffloadModule(module_bytes("blas1", "O2"), device="gpu")
    assert run_case(roomy.rewritten, "saxpy", spec, case, roomy) == expected
    assert sum(lp.stats.offloaded for lp in roomy.loops) == 1


FAULTING_KERNEL = """
.version 7.0
.target sm_75
.address_size 64
.visible .entry fault(.param .u64 ctx, .param .u64 params, .param .u64 trip, .param .u64 out)
{
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 0;
    st.global.u32 [%rd1], 1;
    ret;
}
"""

_FAULT_SCRIPT = f"""
import logging
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import SPECS, Case, module_bytes, run_case
logging.basicConfig(level=logging.WARNING)
offload = OffloadModule(module_bytes("blas1", "O2"), device="gpu")
other = OffloadModule(module_bytes("blas1", "O2"), device="gpu")  # on the same context
loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
spec = SPECS["blas1"]["saxpy"]
faulting = '''{FAULTING_KERNEL}'''

def arrival(n, module=offload):
    case = Case({{"n": n}}, [1.5, 0.0], [0, 0], seed=n)
    assert run_case(module.rewritten, "saxpy", spec, case, module) == run_case(
        module_bytes("blas1", "O2"), "saxpy", spec, case)

arrival(3000, other)

offload.kernels[loop.entry] = offload.context.load_module(faulting).function("fault")
arrival(4096)  # the faulting launch, in this process's context
print("declined:", loop.stats.declined)
print("context:", type(offload.context).__name__)
arrival(5000)  # a later arrival
print("offloaded:", loop.stats.offloaded)
first = offload.context.pid
offload.kernels[loop.entry] = offload.context.load_module(faulting).function("fault")
arrival(4097)  # a fault in the GPU process
arrival(5001)
print("restarted:", offload.context.pid != first, "offloaded:", loop.stats.offloaded)
print("gpu_lost:", offload.gpu_lost)
arrival(3001, other)  # the other module, whose context the first one's fault reset
other_loop = next(lp for lp in other.loops if lp.plan.func.name == "saxpy")
print("other:", type(other.context).__name__, other.faults, other_loop.stats.offloaded, other_loop.stats.declined)
"""


@pytest.mark.gpu
def test_after_a_sticky_fault_later_launches_run_on_the_gpu_with_exact_results() -> None:
    """The faulting arrival runs on the CPU; this process's context cannot be made again,
    so later launches run in a GPU process of its own, which a fault there restarts."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FAULT_SCRIPT], capture_output=True, text=True, timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ILLEGAL_ADDRESS" in done.stdout or "ILLEGAL_ADDRESS" in done.stderr
    assert "runs on the CPU" in done.stderr  # the warning
    assert "GPU error" in done.stdout
    assert "context: WorkerContext" in done.stdout, done.stdout + done.stderr
    assert "offloaded: 1" in done.stdout
    assert "restarted: True offloaded: 2" in done.stdout
    assert "gpu_lost: None" in done.stdout
    assert "other: WorkerContext 0 2 {}" in done.stdout  # no fault of its own, nothing declined


GLOBAL_BASE_LOOP = """(module (memory (export "memory") 4) (global $A i32 (i32.const 0x10000))
  (global $B (mut i32) (i32.const 0x20000))
  (func (export "fill") (param $n i32) (result i32) (local $i i32)
    (loop $l
      (i32.store (i32.add (global.get $A) (i32.shl (local.get $i) (i32.const 2))) (local.get $i))
      (i32.store (i32.add (global.get $B) (i32.shl (local.get $i) (i32.const 2))) (local.get $n))
      (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (i32.add (i32.load (i32.const 0x10ffc)) (i32.load (i32.const 0x20000)))))"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_loop_reading_globals_gets_them_in_the_right_parameters(device: str) -> None:
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    wasm = wat(GLOBAL_BASE_LOOP)
    offload = OffloadModule(wasm, device=device)
    (loop,) = offload.loops
    assert [kind for _, _, kind, _ in loop.plan.live_ins] == ["local", "global", "global"]
    expected = ReferenceInstance(wasm).call("fill", [(I32, 1024)])
    actual = OffloadInstance(wasm, device=device)
    assert actual.call("fill", [(I32, 1024)]) == expected
    assert actual.offloaded == 1


def test_a_loop_the_device_makes_slower_goes_back_to_the_cpu(monkeypatch) -> None:
    import time

    import tensorwasm.runtime.profit as profit

    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-7)  # ~5 ms for this loop
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # every arrival counted from the first
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    real_run = offload.planner.run

    def slow_run(*args):
        time.sleep(0.02)  # every launch takes longer than the CPU estimate
        return real_run(*args)

    monkeypatch.setattr(offload.planner, "run", slow_run)
    monkeypatch.setattr(offload.planner, "startup_seconds", lambda: 0.0)  # (a started device)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    for _ in range(6):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    # The first launch warms up, the next is measured slower; from then on, the CPU.
    assert loop.stats.offloaded == 2
    assert loop.stats.declined == {"its launches ran slower than the CPU would": 4}
    for _ in range(profit.RETRY_EVERY):
        run_case(offload.rewritten, "saxpy", spec, case, offload)
    assert loop.stats.offloaded == 3  # tried on the device again once


def test_auto_starts_the_device_only_once_the_work_so_far_pays_for_its_start(monkeypatch) -> None:
    import tensorwasm.runtime.profit as profit
    from tensorwasm.runtime.planning import NOT_STARTED

    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-7)  # ~5 ms for this loop
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # every arrival counted from the first
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    real_run = offload.planner.run
    runs = []

    def run(*args):
        runs.append(args)
        return real_run(*args)

    monkeypatch.setattr(offload.planner, "run", run)
    # A device whose start costs 12 ms, paid by the first launch.
    monkeypatch.setattr(offload.planner, "startup_seconds", lambda: 0.0 if runs else 0.012)
    monkeypatch.setattr(offload.planner, "startup_for", None)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    for _ in range(6):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    # Every arrival would gain the same (a few ms): the first ones decline until their
    # gains add up to the start's cost, and from then on every one launches.
    declined = loop.stats.declined.get(NOT_STARTED, 0)
    assert loop.stats.declined == {NOT_STARTED: declined} and 1 <= declined < 6
    assert loop.stats.offloaded == len(runs) == 6 - declined
    banked = offload.planner.banked
    assert banked >= 0.012 > banked * declined / (declined + 1)


def test_on_the_host_backend_auto_charges_loading_llvm_to_the_first_launch(monkeypatch, tmp_path) -> None:
    import tensorwasm.runtime.profit as profit
    from tensorwasm.runtime.planning import NOT_STARTED

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))  # (no shared library of it yet)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 5e-7)  # ~10 ms gained an arrival
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # every decline is for the start
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    assert offload.launches.startup_seconds() == profit.STARTUP_SECONDS["cpu"] > 0
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    for _ in range(16):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    # The arrivals decline until their gains pay for loading LLVM's JIT; then they launch.
    declined = loop.stats.declined.get(NOT_STARTED, 0)
    assert 2 <= declined < 16 and loop.stats.offloaded == 16 - declined
    assert offload.planner.banked >= profit.STARTUP_SECONDS["cpu"]
    assert offload.launches.startup_seconds() == 0.0  # started: nothing more to charge


def test_on_the_host_backend_a_kernel_whose_shared_library_is_cached_starts_for_little(monkeypatch, tmp_path) -> None:
    # ~10 ms gained an arrival: less than loading LLVM's JIT, more than loading the kernel's
    # shared library (compiler.target.shared): the first arrival launches.
    import tensorwasm.runtime.profit as profit
    from tensorwasm.compiler.target.shared import SharedCode, find_linker

    if find_linker() is None:
        pytest.skip("no linker on this machine (ld.lld, ld or cc): covered by the test above")
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 5e-7)
    OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="always").kernels.load_all()  # (compiled)
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    assert offload.launches.startup_for(loop) == profit.LIBRARY_START_SECONDS < profit.STARTUP_SECONDS["cpu"]
    spec, case = _saxpy_case()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(
        module_bytes("blas1", "O2"), "saxpy", spec, case
    )
    assert loop.stats.offloaded == 1 and not loop.stats.declined
    assert isinstance(offload.kernels.units[loop.kernel_index].code, SharedCode)
    assert offload.launches.startup_for(loop) == 0.0  # started


def test_a_launch_of_few_iterations_is_modelled_by_its_slowest_thread(monkeypatch) -> None:
    import tensorwasm.runtime.profit as profit

    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-9)
    second = 10**9  # ops: a second on wasmtime
    go, why, model, cpu = profit.Estimate().decide("gpu", second, 0, True, iterations=1)
    assert not go and why == "too few iterations to spread the work over the device's threads"
    assert model > profit.THREAD_SLOWDOWN["gpu"] * cpu * 0.99  # one thread runs it all
    go, why, model, cpu = profit.Estimate().decide("gpu", second, 0, True, iterations=1 << 20)
    assert go and model < cpu / 100
    go, why, _, _ = profit.Estimate().decide("gpu", 1000, 0, True, iterations=1000)
    assert not go and why == "too little work to pay for a launch"


def test_profitability_is_calibrated_against_wasmtime() -> None:
    import tensorwasm.runtime.profit as profit

    seconds = profit.cpu_seconds_per_op()
    assert 1e-12 < seconds < 1e-7  # wasmtime runs somewhere between 10 M and 1 T ops/s


def test_guard_outcomes_are_reused_for_the_same_live_ins_and_memory_size(monkeypatch) -> None:
    import tensorwasm.runtime.guards as guards_module
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    calls = []
    real_check = guards_module.check
    monkeypatch.setattr(guards_module, "check", lambda *a, **k: calls.append(a[1]) or real_check(*a, **k))
    wasm = wat(GLOBAL_BASE_LOOP)
    actual = OffloadInstance(wasm, device="cpu")
    expected = ReferenceInstance(wasm)
    for n in (1024, 1024, 512, 1024, 99999):  # the last one reaches past memory: refused
        assert actual.call("fill", [(I32, n)]) == expected.call("fill", [(I32, n)])
    assert len(calls) == 3  # 1024, 512, 99999: each checked once
    (loop,) = actual.offload.loops
    assert loop.stats.offloaded == 4
    assert actual.memory() == expected.memory("memory")


FIXED_ARRAYS = """(module (memory (export "memory") 1)
 (func (export "k") (param $n i32) (local $i i32)
    (block $exit (loop $l
      (br_if $exit (i32.ge_s (local.get $i) (local.get $n)))
      (i32.store (i32.add (i32.const OUT) (i32.shl (local.get $i) (i32.const 2)))
         (i32.add (i32.load (i32.shl (local.get $i) (i32.const 2))) (i32.const 7)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))))"""


def test_arrays_a_fixed_distance_apart_are_guarded_not_rejected() -> None:
    """Static arrays 1024 elements apart: the loop is parallel for n <= 1024, which only
    the trip count at run time tells; 2 elements apart it never pays, and is rejected."""
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    far = wat(FIXED_ARRAYS.replace("OUT", "4096"))
    (report,) = OffloadModule(far, device="cpu").reports
    assert report.verdict == "offload", report.reason
    for n, offloaded in ((100, 1), (1024, 1), (1025, 0), (5000, 0)):
        expected = ReferenceInstance(far)
        actual = OffloadInstance(far, device="cpu")
        assert actual.call("k", [(I32, n)]) == expected.call("k", [(I32, n)])
        assert actual.memory() == expected.memory("memory")
        assert actual.offloaded == offloaded, n
    (near,) = OffloadModule(wat(FIXED_ARRAYS.replace("OUT", "8")), device="cpu").reports
    assert near.verdict == "reject" and "distance 2" in near.reason


CALLS_IN_AND_OUT_OF_LOOPS = """(module (memory (export "memory") 1)
  (func $inside (param i32) (result i32) (i32.mul (local.get 0) (i32.const 3)))
  (func $deeper (param i32) (result i32) (call $inside (local.get 0)))
  (func $outside (result i32) (i32.const 40))
  (func (export "k") (param $n i32) (result i32) (local $i i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (call $deeper (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (i32.add (call $outside) (i32.load (i32.const 8)))))"""


def test_offload_translates_only_the_functions_its_loops_need() -> None:
    from tensorwasm.compiler.frontend.translate import loop_closure
    from tensorwasm.compiler.prepare import prepare_offload
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    wasm = wat(CALLS_IN_AND_OUT_OF_LOOPS)
    preparation = prepare_offload(wasm)
    assert loop_closure(preparation.state.wasm.module) == {0, 1, 3}  # not $outside, called after the loop
    assert [f.attrs.get("untranslated", False) for f in preparation.state.dialect.module.functions[:4]] == [
        False, False, True, False
    ]  # fmt: skip
    expected = ReferenceInstance(wasm).call("k", [(I32, 500)])
    actual = OffloadInstance(wasm, device="cpu")
    assert actual.call("k", [(I32, 500)]) == expected
    assert actual.offloaded == 1


# out[i] = in[i] + 1 with a base from the caller; the loads use a static offset of 16 on an
# operand that starts 8 bytes below zero when base is 0: Wasm traps there (the i32 operand
# wraps), though operand + offset would land inside memory.
PROVEN_ACCESSES = """(module (memory (export "memory") 1)
 (func (export "k") (param $n i32) (param $base i32) (param $out i32) (local $i i32)
    (block $exit (loop $l
      (br_if $exit (i32.ge_s (local.get $i) (local.get $n)))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2)))
         (i32.add (i32.load offset=16 (i32.sub (i32.add (local.get $base) (i32.shl (local.get $i) (i32.const 2)))
                                               (i32.const 8)))
                  (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))))"""


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_accesses_run_untested_only_where_the_guards_prove_them(device: str) -> None:
    """A kernel's affine accesses carry no bounds test (nor, on a GPU, an alignment test):
    the guards refuse a launch unless every one is inside memory with a non-negative i32
    operand, and on a GPU aligned. Each refusal runs the loop on wasmtime, trap included."""
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    wasm = wat(PROVEN_ACCESSES)
    gpu_like = device != "cpu"
    outside, misaligned = "outside linear memory", "not aligned"
    cases = [  # (n, base, out) -> why it runs on wasmtime (None: offloaded)
        ((64, 4096, 8192), None),
        ((64, 0, 8192), outside),  # operand -8 at i = 0: Wasm traps
        ((64, 65536 - 64 * 4 + 8 - 16, 8192), None),  # the last load ends at the last byte
        ((64, 65536 - 64 * 4 + 8 - 15, 8192), outside),  # one byte past it: traps
        ((64, 4098, 8192), misaligned if gpu_like else None),  # loads 2 bytes off alignment
        ((64, 4096, 8194), misaligned if gpu_like else None),  # stores 2 bytes off alignment
    ]
    for (n, base, out), why in cases:
        expected = ReferenceInstance(wasm)
        actual = (
            SimulatedOffloadInstance(wasm) if device == "simulated" else OffloadInstance(wasm, device=device)
        )
        args = [(I32, n), (I32, base), (I32, out)]
        assert actual.call("k", args) == expected.call("k", args), (n, base, out)
        assert actual.memory() == expected.memory("memory")
        assert actual.offloaded == int(why is None), (n, base, out)
        (loop,) = actual.offload.loops
        if why is not None:
            assert why in next(iter(loop.stats.declined))


# A store after a loop tested at its top, at that loop's exit value j = m (one past its last
# iteration): the guards must reach it. Row i holds m + 1 words.
AFTER_AN_INNER_LOOP = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (param $m i32) (param $off i32) (local $i i32) (local $j i32)
    (block $done (loop $outer
      (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
      (local.set $j (i32.const 0))
      (block $ie (loop $inner
        (br_if $ie (i32.ge_s (local.get $j) (local.get $m)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $inner)))
      (i32.store (i32.add (local.get $off)
          (i32.shl (i32.add (i32.mul (local.get $i) (i32.add (local.get $m) (i32.const 1))) (local.get $j))
                   (i32.const 2)))
        (i32.add (local.get $i) (i32.const 1000)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $outer)))))"""

# A triangular nest: the innermost loop runs j times, a count the guards cannot take once.
TRIANGLE = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (param $m i32) (local $i i32) (local $j i32) (local $l i32)
    (block $done (loop $outer
      (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
      (local.set $j (i32.const 0))
      (block $je (loop $mid
        (br_if $je (i32.ge_s (local.get $j) (local.get $m)))
        (local.set $l (i32.const 0))
        (block $le (loop $inn
          (br_if $le (i32.ge_s (local.get $l) (local.get $j)))
          (i32.store (i32.shl (i32.add (i32.mul (local.get $i) (i32.const 64)) (local.get $l)) (i32.const 2))
                     (local.get $j))
          (local.set $l (i32.add (local.get $l) (i32.const 1)))
          (br $inn)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $mid)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $outer)))))"""


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(
    ("program", "args"),
    [
        (AFTER_AN_INNER_LOOP, (100, 3, 1024)),  # every row's last word comes back
        (AFTER_AN_INNER_LOOP, (100, 3, 65536 - 4 * (99 * 4 + 3))),  # the last store is past memory: trap
        (TRIANGLE, (10, 20)),
    ],
    ids=["exit-value", "exit-value-traps", "triangle"],
)
def test_inner_loop_exit_values_and_varying_counts_match_wasmtime(program: str, args, device: str) -> None:
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    wasm = wat(program)
    expected = ReferenceInstance(wasm)
    actual = SimulatedOffloadInstance(wasm) if device == "simulated" else OffloadInstance(wasm, device=device)
    call = [(I32, a) for a in args]
    assert actual.call("run", call) == expected.call("run", call)
    assert actual.memory() == expected.memory("memory")


# Rows of A, each plus one, into B: a perfect nest, so one 2-D launch; with B one row past
# A, a row's stores meet the next row's loads (the nest declines), but within a row nothing
# meets (each row's inner loop launches on its own, in order).
SHIFTED_ROWS = """(module (memory (export "memory") 2)
  (func (export "run") (param $a i32) (param $b i32) (param $m i32) (param $n i32)
    (local $i i32) (local $j i32) (local $k i32)
    (block $done
      (br_if $done (i32.le_s (local.get $m) (i32.const 0)))
      (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
      (loop $rows
        (local.set $j (i32.const 0))
        (loop $cols
          (local.set $k (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))
          (i32.store (i32.add (local.get $b) (local.get $k))
            (i32.add (i32.load (i32.add (local.get $a) (local.get $k))) (i32.const 1)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $cols (i32.lt_s (local.get $j) (local.get $n))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $rows (i32.lt_s (local.get $i) (local.get $m)))))))"""


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_the_loops_inside_a_declined_nest_launch_on_their_own(device: str) -> None:
    import wasmtime

    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime.api import offload_report
    from tensorwasm.runtime.reference import ReferenceInstance
    from tests.conftest import wat

    wasm = wat(SHIFTED_ROWS)
    m, n = 6, 300
    for b in (4 * m * n + 64, 4 * n):  # apart: one 2-D launch; a row apart: a launch per row
        expected = ReferenceInstance(wasm)
        actual = OffloadInstance(wasm, device=SimulatedDevice() if device == "simulated" else device)
        args = [(I32, 0), (I32, b), (I32, m), (I32, n)]
        for _ in range(2):  # memory starts at zero; the second call adds to the first's rows
            assert actual.call("run", args) == expected.call("run", args)
            assert actual.memory() == expected.memory("memory")
        wasmtime.Module.validate(wasmtime.Engine(), actual.offload.rewritten)
        nest, row = sorted(actual.offload.loops, key=lambda lp: lp.stats.offset)
        records = {loop.offset: loop for loop in offload_report(actual.offload).loops}
        assert (
            records[row.stats.offset].inside == nest.stats.offset
            and records[nest.stats.offset].inside is None
        )
        if b > 4 * m * n:
            assert (nest.stats.offloaded, row.stats.arrivals) == (2, 0)
        else:
            assert nest.stats.offloaded == 0 and any("overlap" in why for why in nest.stats.declined)
            assert row.stats.offloaded == 2 * m


def _imported_modules(path) -> set[str]:
    """The modules a file imports, lazily (LazyModule's first argument) or not."""
    import ast

    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LazyModule" and node.args:
            names.add(node.args[0].value)
    return names


def test_planning_knows_nothing_of_the_driver_the_device_memory_or_the_gpu_process() -> None:
    """Planning (guards, profitability, which arrivals replay) imports none of them, neither
    itself nor through what it imports."""
    import subprocess
    import sys
    from pathlib import Path

    import tensorwasm.runtime.planning as planning

    forbidden = {f"tensorwasm.runtime.{name}" for name in ("driver", "mirror", "remote")}
    assert _imported_modules(Path(planning.__file__)) & forbidden == set()
    code = f"import sys, tensorwasm.runtime.planning; print(sorted(set(sys.modules) & {forbidden!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert done.stdout.strip() == "[]"


def test_the_device_given_at_construction_loads_and_runs_the_kernels() -> None:
    """A Device passed to the module is the one its kernels load on and its launches use;
    the simulated device takes the GPU path (copies through its context) with host code."""
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime.host_device import HostDevice

    class Counting(HostDevice):
        label = "cpu (counted)"

        def __init__(self) -> None:
            self.loads = 0

        def load_kernels(self, prepared):
            self.loads += 1
            return super().load_kernels(prepared)

    wasm = module_bytes("blas1", "O2")
    spec, case = _saxpy_case()
    expected = run_case(wasm, "saxpy", spec, case)
    for device in (Counting(), SimulatedDevice()):
        offload = OffloadModule(wasm, device=device)
        assert offload.backend is device and offload.device == device.kind and offload.code_kind == "cpu"
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
        loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
        assert loop.stats.offloaded == 1 and loop.stats.device == device.label
        if isinstance(device, Counting):
            assert device.loads == 1
        else:
            assert [d for d, _ in device.context.copies].count("in") >= 1 and offload.mirror is not None
        offload.close()


def test_the_context_block_puts_each_named_field_in_its_slot() -> None:
    from tensorwasm.compiler.lower import abi

    fields = {"memory_base": 1, "memory_size": 2, "memory_capacity": 3, "max_pages": 4, "globals_at": 5,
              "tables_at": 6, "data_at": 7, "elems_at": 8, "written_at": 9, "written_count": 10}  # fmt: skip
    slots = {abi.CTX_MEM_BASE: 1, abi.CTX_MEM_SIZE: 2, abi.CTX_MEM_CAPACITY: 3, abi.CTX_MEM_MAX_PAGES: 4,
             abi.CTX_GLOBALS: 5, abi.CTX_TABLES: 6, abi.CTX_DATA: 7, abi.CTX_ELEMS: 8, abi.CTX_WRITTEN: 9,
             abi.CTX_WRITTEN_COUNT: 10}  # fmt: skip
    assert list(abi.context_block(**fields)) == [slots.get(i, 0) for i in range(abi.CTX_SLOTS)]


def test_a_launch_on_the_device_and_on_the_host_hand_the_kernel_the_same_context() -> None:
    """The GPU path's scratch image and the host backend's context differ only where they
    point: the device's memory and written ranges, or the host's."""
    import struct

    from tensorwasm.compiler.lower import abi
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime.device_launch import device_arguments
    from tensorwasm.runtime.host_device import HostLaunches

    wasm = module_bytes("blas1", "O2")
    offload = OffloadModule(wasm, device=SimulatedDevice())
    spec, case = _saxpy_case()
    run_case(offload.rewritten, "saxpy", spec, case, offload)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    (ready,) = offload.planner.guard_cache[loop.kernel_index].values()
    (arrival,) = ready._arrivals.values()
    mirror = offload.mirror
    image, _ = device_arguments(ready, mirror, arrival)
    device = struct.unpack(f"<{abi.CTX_SLOTS}Q", image[: 8 * abi.CTX_SLOTS])
    host_image, _ = HostLaunches(offload).host_arguments(ready)
    host = struct.unpack(f"<{abi.CTX_SLOTS}Q", host_image)
    pointers = {abi.CTX_MEM_BASE, abi.CTX_WRITTEN}
    assert [v for i, v in enumerate(device) if i not in pointers] == [
        v for i, v in enumerate(host) if i not in pointers
    ]
    assert (
        device[abi.CTX_MEM_SIZE] == ready.size
        and device[abi.CTX_MEM_MAX_PAGES] == ready.size // abi.PAGE_SIZE
    )
    assert device[abi.CTX_MEM_BASE] == mirror.memory_ptr and host[abi.CTX_MEM_BASE] == 0
    assert device[abi.CTX_WRITTEN] == mirror.scratch_ptr + 8 * ready.back_slots
    offload.close()
