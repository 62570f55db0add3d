"""Each loop kernel is compiled, cached and loaded on its own, at its first launch; in the
background, while wasmtime runs the arrivals, where offload weighs what a launch pays."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tensorwasm.compiler import prepare
from tensorwasm.compiler.errors import CompileError
from tensorwasm.runtime import loop_kernels
from tensorwasm.runtime.cache import default_cache
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import COMPILING
from tests.conftest import ROOT
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case


def _fresh(wasm: bytes, **options) -> OffloadModule:
    """The module as a new process sees it: the cache's files, not its memory."""
    default_cache().memory.clear()
    return OffloadModule(wasm, **options)


def _saxpy(offload: OffloadModule, wasm: bytes):
    spec, case = _saxpy_case()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(wasm, "saxpy", spec, case)
    return next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")


def test_a_launch_compiles_its_own_kernel_and_no_other(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    assert len(offload.loops) > 1 and not offload.kernels.units  # preparing compiles nothing
    loop = _saxpy(offload, wasm)
    assert loop.stats.offloaded == 1
    assert set(offload.kernels.units) == {loop.kernel_index}
    assert dict(offload.kernels) == {loop.entry: offload.kernels[loop.entry]}
    assert offload.kernels.counts.compiled == 1 and offload.kernels.counts.cached == 0


def test_a_kernel_compiled_once_is_read_from_the_cache_without_the_compiler(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    _saxpy(_fresh(wasm, device="cpu"), wasm)
    warm = _fresh(wasm, device="cpu")

    def no_compiling(*args, **kwargs):
        raise AssertionError("a cached kernel was compiled again")

    monkeypatch.setattr(prepare, "compile_loop_kernels", no_compiling)
    monkeypatch.setattr(prepare, "prepare_offload", no_compiling)
    loop = _saxpy(warm, wasm)
    assert loop.stats.offloaded == 1 and warm.kernels.counts.cached == 1
    assert warm._preparation is None  # no analysis ran


def test_kernels_read_from_the_cache_load_into_one_engine_of_the_module(tmp_path, monkeypatch) -> None:
    # On a machine without a linker (no shared libraries: compiler.target.shared).
    from tensorwasm.compiler.target import shared

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(loop_kernels, "find_linker", lambda: None)
    monkeypatch.setattr(shared, "find_linker", lambda: None)
    wasm = module_bytes("blas1", "O2")
    _fresh(wasm, device="cpu").kernels.load_all()
    warm = _fresh(wasm, device="cpu")
    warm.kernels.load_all()
    assert warm.kernels.counts.cached == len(warm.loops) > 1
    codes = [unit.code for unit in warm.kernels.units.values()]
    assert len({id(code.engine) for code in codes}) == 1  # no engine (nor target machine) per kernel
    assert len({code.address(lp.entry) for code, lp in zip(codes, warm.loops, strict=True)}) == len(codes)
    first = warm.loops[0].kernel_index
    again = warm.kernels._host_engine().load(warm.kernels.key(first), warm.kernels.units[first].host_object)
    assert again is warm.kernels.units[first].code  # a unit loads once
    loop = _saxpy(warm, wasm)  # and runs as it should
    assert loop.stats.offloaded == 1
    other = _fresh(wasm, device="cpu")
    other.kernels.load_all()
    assert other.kernels.units[first].code.engine is not codes[0].engine  # another module: its own


def test_kernels_are_cached_by_module_index_and_target(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    first, second = offload.loops[0].kernel_index, offload.loops[1].kernel_index
    keys = {offload.kernels.key(first), offload.kernels.key(second)}
    other = _fresh(module_bytes("stencil", "O2"), device="cpu")
    keys.add(other.kernels.key(other.loops[0].kernel_index))
    assert len(keys) == 3
    assert offload.kernels.key(first) == _fresh(wasm, device="cpu").kernels.key(first)


def test_a_kernel_that_cannot_be_compiled_declines_its_arrivals(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    tries = []

    def failing(*args, **kwargs):
        tries.append(args)
        raise CompileError("no lowering for this (planted)")

    monkeypatch.setattr(prepare, "compile_loop_kernels", failing)
    loop = _saxpy(offload, wasm)
    _saxpy(offload, wasm)
    assert loop.stats.offloaded == 0 and len(tries) == 1
    assert loop.stats.declined == {"the kernel could not be compiled: no lowering for this (planted)": 2}


def test_the_kernels_load_each_on_its_own_and_all_at_once_on_request(tmp_path, monkeypatch) -> None:
    from tensorwasm.runtime.host_device import HostDevice

    class Counting(HostDevice):
        def __init__(self) -> None:
            self.units = []

        def load_kernels(self, unit):
            self.units.append(unit)
            return super().load_kernels(unit)

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    device = Counting()
    offload = _fresh(module_bytes("blas1", "O2"), device=device)
    offload.kernels.load_all()
    assert set(offload.kernels) == {lp.entry for lp in offload.loops}
    assert sorted(len(unit.loops) for unit in device.units) == [1] * len(offload.loops)
    offload.reload_kernels()  # as after a context reset: loaded again at the next use, code kept
    assert not offload.kernels and len(offload.kernels.units) == len(offload.loops)
    entry = offload.loops[0].entry
    assert offload.kernels[entry] is not None and len(device.units) == len(offload.loops) + 1
    with pytest.raises(KeyError):
        offload.kernels["tw_kernel_none"]


@pytest.fixture
def background(tmp_path, monkeypatch) -> pytest.MonkeyPatch:
    """Kernels compiled on worker threads (two), in a cache of the test's own."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    monkeypatch.setenv("TENSORWASM_COMPILE_THREADS", "2")
    monkeypatch.setattr(loop_kernels, "_POOL", None)  # a pool of the test's settings
    return monkeypatch


def _held(monkeypatch, release: threading.Event, started: list | None = None, fail: bool = False):
    """Every kernel compile made slow: it waits for ``release`` (then fails, with ``fail``)."""
    compile_for_real = prepare.compile_loop_kernels

    def held(*args, **kwargs):
        if started is not None:
            started.append(threading.current_thread().name)
        assert release.wait(60), "the test never let the compile finish"
        if fail:
            raise CompileError("no lowering for this (planted)")
        return compile_for_real(*args, **kwargs)

    monkeypatch.setattr(prepare, "compile_loop_kernels", held)


def test_a_slow_background_compile_does_not_hold_up_the_arrivals(background) -> None:
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    for _ in range(3):  # each arrival runs on wasmtime, with the same results, while it compiles
        loop = _saxpy(offload, wasm)
    assert loop.stats.arrivals == 3 and loop.stats.offloaded == 0
    assert loop.stats.declined == {COMPILING: 3}
    assert len(started) == 1 and started[0].startswith("tensorwasm-compile")  # one compile, on a worker
    assert offload.kernels.counts.compiled == 0 and loop.kernel_index in offload.kernels.pending
    release.set()
    offload.kernels.wait()
    assert set(offload.kernels.units) == {loop.kernel_index}
    assert offload.kernels.counts.compiled == offload.kernels.counts.background == 1
    _saxpy(offload, wasm)  # the first arrival after it is ready launches it
    assert loop.stats.offloaded == 1 and loop.stats.declined == {COMPILING: 3} and len(started) == 1
    from tensorwasm.runtime.api import offload_report

    row = next(r for r in offload_report(offload).loops if r.offloaded)
    assert row.declined == {COMPILING: 3}  # the report says how many arrivals ran meanwhile


def test_a_kernel_in_the_cache_launches_at_its_first_arrival_without_a_background_compile(background) -> None:
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = module_bytes("blas1", "O2")
    first = _fresh(wasm, device="cpu")
    _saxpy(first, wasm)  # compiling on a worker thread: this arrival runs on wasmtime
    release.set()
    first.kernels.wait()
    warm = _fresh(wasm, device="cpu")  # a warm run: the kernel's code is in the cache's files
    loop = _saxpy(warm, wasm)
    assert loop.stats.offloaded == 1 and loop.stats.declined == {}  # read at once, launched
    assert warm.kernels.counts.cached == 1 and warm.kernels.counts.compiled == 0 and len(started) == 1


def test_an_arrival_worth_more_than_the_compile_waits_for_its_kernel(background) -> None:
    import tensorwasm.runtime.profit as profit

    background.setattr(profit, "cpu_seconds_per_op", lambda: 1e-3)  # seconds of CPU work: worth waiting
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    threading.Timer(0.2, release.set).start()
    loop = _saxpy(offload, wasm)
    assert loop.stats.offloaded == 1 and loop.stats.declined == {}  # launched once compiled
    assert len(started) == 1


def test_an_error_in_a_background_compile_is_the_loops_declined_reason(background) -> None:
    release = threading.Event()
    _held(background, release, fail=True)
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    loop = _saxpy(offload, wasm)
    release.set()
    offload.kernels.wait()
    _saxpy(offload, wasm)
    _saxpy(offload, wasm)
    failed = "the kernel could not be compiled: no lowering for this (planted)"
    assert loop.stats.offloaded == 0
    assert loop.stats.declined == {COMPILING: 1, failed: 2}
    assert offload.kernels.failed == {loop.kernel_index: failed}


def test_an_unexpected_exception_in_a_background_compile_is_reported_too(background) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("LLVM said no")

    background.setattr(prepare, "compile_loop_kernels", broken)
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    loop = _saxpy(offload, wasm)
    offload.kernels.wait()
    _saxpy(offload, wasm)
    assert loop.stats.declined == {
        COMPILING: 1, "the kernel could not be compiled: RuntimeError: LLVM said no": 1,
    }  # fmt: skip


def test_independent_kernels_compile_side_by_side(background) -> None:
    both = threading.Barrier(2, timeout=60)  # broken unless two compiles run at once
    compile_for_real = prepare.compile_loop_kernels

    def meeting(*args, **kwargs):
        both.wait()
        return compile_for_real(*args, **kwargs)

    background.setattr(prepare, "compile_loop_kernels", meeting)
    offload = _fresh(module_bytes("blas1", "O2"), device="cpu")
    first, second = offload.loops[:2]
    assert first.kernel_index != second.kernel_index
    assert offload.kernels.compile(first) == offload.kernels.compile(second) == COMPILING
    offload.kernels.wait()
    assert not offload.kernels.failed
    assert set(offload.kernels.units) == {first.kernel_index, second.kernel_index}
    assert offload.kernels.compile(first) is None and offload.kernels.compile(second) is None


def test_a_unit_asked_for_while_it_compiles_waits_for_that_compile(background) -> None:
    release, started = threading.Event(), []
    _held(background, release, started)
    offload = _fresh(module_bytes("blas1", "O2"), device="cpu")
    loop = offload.loops[0]
    assert offload.kernels.compile(loop) == COMPILING
    threading.Timer(0.2, release.set).start()
    assert offload.kernels[loop.entry] is not None  # waited for the worker's code
    assert len(started) == 1 and offload.kernels.counts.compiled == 1


def test_arrivals_declined_while_compiling_close_the_gate_only_briefly() -> None:
    """A few arrivals kept in Wasm after each (a host call waits for the interpreter lock
    while a compile runs), never more than COMPILING_WAIT_LIMIT: the kernel launches soon
    after it is ready; and they do not count towards the backoff of other declines."""
    from tensorwasm.runtime.planning import ArrivalGate

    class Wait:
        def __init__(self) -> None:
            self.sets = []

        def set(self, context, value) -> None:
            self.sets.append(value)

    gate = object.__new__(ArrivalGate)  # its Wasm side stood in for by a recorder
    gate.wait, gate.context, gate.declines, gate.compiling = Wait(), 0, 0, 0
    for _ in range(3 * ArrivalGate.BACKOFF_AFTER):
        gate.declined(COMPILING)
    limit = ArrivalGate.COMPILING_WAIT_LIMIT
    assert gate.wait.sets == [min(1 << k, limit) for k in range(3 * ArrivalGate.BACKOFF_AFTER)]
    assert gate.declines == 0
    gate.wait.sets.clear()
    for _ in range(ArrivalGate.BACKOFF_AFTER):
        gate.declined("too little work to pay for a launch")
    assert gate.wait.sets == [1]  # other reasons back off as before


@pytest.mark.parametrize(
    ("setting", "mode", "background"),
    [("", "auto", True), ("", "always", False), ("sync", "auto", False), ("background", "always", True),
     ("auto", "always", False)],
)  # fmt: skip
def test_where_kernels_compile_in_the_background(tmp_path, monkeypatch, setting, mode, background) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORWASM_COMPILE", setting)
    assert _fresh(module_bytes("blas1", "O2"), device="cpu", mode=mode).kernels.background() is background


DECLINED = """
import sys
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case

wasm = module_bytes("blas1", "O2")
offload = OffloadModule(wasm, device="cpu", mode=sys.argv[1])
spec, case = _saxpy_case(8)
assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(wasm, "saxpy", spec, case)
llvm = ("llvmlite.binding", "llvmlite.ir", "tensorwasm.compiler.lower.function")
loaded = sorted(m for m in sys.modules if m.startswith(llvm))
print(offload.kernels.counts.compiled, len(offload.kernels.units), ",".join(loaded))
"""


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_program_whose_loops_all_decline_compiles_nothing_and_loads_no_llvm(tmp_path, mode) -> None:
    import os

    env = {**os.environ, "TENSORWASM_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", DECLINED, mode], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["0", "0"], out  # cold: the module analysed, no kernel compiled, no LLVM


@pytest.mark.gpu
def test_on_the_gpu_each_launched_kernel_is_a_module_of_its_own(tmp_path, monkeypatch) -> None:
    from tests.offload_cases import SPECS, Case

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="gpu")
    _saxpy(offload, wasm)
    spec = SPECS["blas1"]["sscal"]
    case = Case({"n": 4096}, [2.5], [0], seed=3)
    assert run_case(offload.rewritten, "sscal", spec, case, offload) == run_case(wasm, "sscal", spec, case)
    launched = [lp for lp in offload.loops if lp.stats.offloaded]
    assert {lp.plan.func.name for lp in launched} == {"saxpy", "sscal"}
    assert set(offload.kernels) == {lp.entry for lp in launched}  # nothing else compiled or loaded
    modules = [offload.backend.cu_modules[lp.entry] for lp in launched]
    assert modules[0] is not modules[1]
    assert [tuple(m.entries) for m in modules] == [(lp.entry,) for lp in launched]
    offload.close()


@pytest.mark.gpu
def test_on_the_gpu_kernels_compiled_in_the_background_launch_once_ready(background) -> None:
    """PTX made on worker threads (no CUDA call there), loaded and launched by the arrivals
    after it is ready; results equal wasmtime's whichever ran them."""
    from tests.offload_cases import SPECS, Case

    release = threading.Event()
    _held(background, release)
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="gpu")
    spec = SPECS["blas1"]["sscal"]
    case = Case({"n": 4096}, [2.5], [0], seed=3)
    expected = run_case(wasm, "sscal", spec, case)
    loop = _saxpy(offload, wasm)
    assert run_case(offload.rewritten, "sscal", spec, case, offload) == expected
    sscal = next(lp for lp in offload.loops if lp.plan.func.name == "sscal")
    assert loop.stats.declined == sscal.stats.declined == {COMPILING: 1}
    release.set()
    offload.kernels.wait()
    assert offload.kernels.counts.background == 2 and not offload.kernels.failed
    _saxpy(offload, wasm)
    assert run_case(offload.rewritten, "sscal", spec, case, offload) == expected
    assert loop.stats.offloaded == sscal.stats.offloaded == 1
    offload.close()


_WARM_HOST_RUN = """
import os, sys
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case

os.environ["TENSORWASM_CACHE_DIR"] = sys.argv[1]  # (the tests' modules chose one of their own)

warm = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="always")
warm.kernels.load_all()
spec, case = _saxpy_case()
assert run_case(warm.rewritten, "saxpy", spec, case, warm) == run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
print(warm.kernels.counts.cached, warm.kernels.counts.compiled, sorted(type(u.code).__name__ for u in warm.kernels.units.values())[0],
      "llvmlite.binding" in sys.modules)
"""


def test_where_a_linker_is_a_warm_run_loads_host_kernels_as_shared_libraries_without_llvm(tmp_path) -> None:
    import os

    from tensorwasm.compiler.target.shared import find_linker
    from tests.conftest import ROOT

    if find_linker() is None:
        pytest.skip("no linker on this machine (ld.lld, ld or cc): host kernels load through the JIT")
    runs = [
        subprocess.run([sys.executable, "-c", _WARM_HOST_RUN, str(tmp_path / "cache")], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout.split()
        for _ in range(2)
    ]  # fmt: skip
    cold, warm = runs
    assert int(cold[1]) > 0 and cold[3] == "True"  # compiled (LLVM), each with its library
    assert int(warm[0]) > 1 and warm[1] == "0" and warm[2] == "SharedCode" and warm[3] == "False"
    assert not os.listdir(tmp_path / "cache" / "lib")  # each library's file removed once loaded
