"""The kernels a run would have launched on the host's threads, remembered so that the next
run loads them while the program starts (runtime/known_host.py): on the host backend, and
standing in for a GPU whose start does not pay (on the simulated device)."""

from __future__ import annotations

import pytest

from tensorwasm.runtime import known_host, profit
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import NOT_STARTED
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_gpu_start import _saxpy_on_a_slow_start
from tests.runtime.test_offload import _saxpy_case


def _gains(
    modelled: dict[int, float] | None = None, measured: dict[int, float] | None = None
) -> known_host.Gains:
    gains = known_host.Gains()
    for index, seconds in (modelled or {}).items():
        gains.would_have(index, seconds)
    for index, seconds in (measured or {}).items():
        gains.launched(index, seconds)
    return gains


def test_kernels_are_remembered_where_their_gains_add_up_and_forgotten_where_they_do_not() -> None:
    key = "a module's key"
    least = known_host.EARLY_GAIN_SECONDS
    assert known_host.kernels_last_time(key) == ()
    known_host.remember_kernels(key, _gains({3: 0.6 * least}))
    assert known_host.kernels_last_time(key) == ()  # too little gained: the start would not pay
    known_host.remember_kernels(key, _gains({3: 0.6 * least, 5: 0.6 * least, 7: -1.0}))
    assert known_host.kernels_last_time(key) == (3, 5)  # 7 lost on the host: not loaded for it
    assert known_host.kernels_last_time("another module's key") == ()
    known_host.remember_kernels(key, _gains())
    assert known_host.kernels_last_time(key) == ()


def test_a_kernel_measured_slower_on_the_host_is_not_loaded_again_for_what_the_model_says() -> None:
    # ... and is parked from its first arrival in the runs that follow, PARKED_RUNS of them.
    key = "a module whose kernel 2 the model favours"
    least = known_host.EARLY_GAIN_SECONDS
    known_host.remember_kernels(key, _gains({2: 2 * least}))
    assert known_host.kernels_last_time(key) == (2,)
    known_host.remember_kernels(key, _gains({2: 2 * least}, {2: -0.5 * least}))  # it launched: slower
    assert known_host.kernels_last_time(key) == () and known_host.slower_last_time(key) == {2}
    for _ in range(
        known_host.PARKED_RUNS - 1
    ):  # runs that parked it: the model's gain does not bring it back
        known_host.remember_kernels(key, _gains({2: 2 * least}))
        assert known_host.kernels_last_time(key) == () and known_host.slower_last_time(key) == {2}
    known_host.remember_kernels(key, _gains({2: 2 * least}))  # its measurement dropped: the model decides
    assert known_host.kernels_last_time(key) == (2,) and known_host.slower_last_time(key) == set()
    known_host.remember_kernels(key, _gains({2: 2 * least}, {2: -0.5 * least}))
    known_host.remember_kernels(key, _gains({}, {2: 3 * least}))  # measured again (a launch that paid)
    assert known_host.kernels_last_time(key) == (2,)


def test_kernels_that_load_from_their_libraries_are_remembered_for_a_smaller_gain() -> None:
    # Loading them costs what their first launches pay anyway (no LLVM): a few ms gained do.
    key = "a module whose kernels link"
    least = known_host.CHEAP_EARLY_GAIN_SECONDS
    assert least < known_host.EARLY_GAIN_SECONDS
    known_host.remember_kernels(key, _gains({3: 2 * least}), cheap=lambda index: True)
    assert known_host.kernels_last_time(key) == (3,)
    known_host.remember_kernels(key, _gains({3: 2 * least, 5: least}), cheap=lambda index: index == 3)
    assert known_host.kernels_last_time(key) == ()  # 5 loads through LLVM: the whole start again
    known_host.remember_kernels(key, _gains({3: 0.5 * least}), cheap=lambda index: True)
    assert known_host.kernels_last_time(key) == ()  # too little even so


def _without_a_linker(monkeypatch) -> None:
    """Kernels load through LLVM's JIT (no shared libraries: compiler.target.shared), whose
    start is what an early load saves."""
    from tensorwasm.compiler.target import shared
    from tensorwasm.runtime import loop_kernels, while_starting

    for module in (shared, loop_kernels, while_starting):
        monkeypatch.setattr(module, "find_linker", lambda: None)


def _host_module(monkeypatch, seconds_per_op: float) -> OffloadModule:
    _without_a_linker(monkeypatch)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: seconds_per_op)
    monkeypatch.setitem(profit.OP_SHARE, "cpu", 0.5)  # (two cores' worth, whatever this machine has)
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    return OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")


def test_on_the_host_backend_a_kernel_the_last_run_launched_late_loads_as_the_run_begins(
    monkeypatch, tmp_path
) -> None:
    # An arrival gains ~30 ms on the host's threads (by the model): the first pays nothing
    # of the host's start (40 ms), the second pays it (the kernel compiles on a worker, and
    # wasmtime runs the loop meanwhile). The next run loads the kernel as it begins, and its
    # first arrival launches.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    first = _host_module(monkeypatch, 1.5e-6)
    assert not first.load_host_kernels_early()  # nothing remembered yet
    for _ in range(2):
        assert run_case(first.rewritten, "saxpy", spec, case, first) == expected
    loop = next(lp for lp in first.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 0 and loop.stats.declined[NOT_STARTED] == 1
    assert first.planner.gains.modelled[loop.kernel_index] >= known_host.EARLY_GAIN_SECONDS
    first._kernels.wait()
    first.remember_host_kernels()
    first.close()
    assert known_host.kernels_last_time(first.key) == (loop.kernel_index,)

    from tensorwasm.runtime import host_device

    monkeypatch.setattr(host_device, "_WARMING", None)
    second = _host_module(monkeypatch, 1.5e-6)
    assert second.load_host_kernels_early()
    assert loop.kernel_index in second._kernels.pending  # loading on a worker, before any arrival
    assert host_device._WARMING is not None or host_device.CPUS == 1  # and its launch threads starting
    second._kernels.wait()  # (the program's start, on wasmtime, meanwhile)
    assert run_case(second.rewritten, "saxpy", spec, case, second) == expected
    again = next(lp for lp in second.loops if lp.plan.func.name == "saxpy")
    assert again.stats.offloaded == 1 and not again.stats.declined
    second.close()


def test_a_run_whose_loops_gain_less_than_the_start_forgets_the_kernels(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(
        "TENSORWASM_CACHE_DIR", str(tmp_path / "cache")
    )  # (no launch measured by another test)
    spec, case = _saxpy_case()
    module = _host_module(monkeypatch, 1.5e-6)
    for _ in range(2):
        run_case(module.rewritten, "saxpy", spec, case, module)
    module._kernels.wait()
    module.remember_host_kernels()
    assert known_host.kernels_last_time(module.key)
    module.close()
    short = _host_module(monkeypatch, 1.5e-6)  # (the same module: its key) with one arrival now
    run_case(short.rewritten, "saxpy", spec, case, short)
    short._kernels.wait()
    short.remember_host_kernels()
    assert known_host.kernels_last_time(short.key) == ()
    short.close()
    assert not _host_module(monkeypatch, 1.5e-6).load_host_kernels_early()


def _remembered_then_run_again(first: OffloadModule, loop, device) -> OffloadModule:
    """The standing-in run ``first`` ends, remembering ``loop``'s kernel; the next run's
    module, which begins loading it as it starts."""
    first._while_starting._kernels.wait()
    first.remember_host_kernels()
    first.close()
    assert known_host.kernels_last_time(first.key) == (loop.kernel_index,)
    second = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    assert second.load_host_kernels_early()
    return second


def test_standing_in_for_a_gpu_a_kernel_the_last_run_launched_late_loads_as_the_run_begins(
    monkeypatch, tmp_path
) -> None:
    # The GPU's start is far off ("100 s"); each arrival gains ~30 ms on the host's threads:
    # the first run's second arrival pays for the host's start, too late to launch.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    _without_a_linker(monkeypatch)
    device, first, loop = _saxpy_on_a_slow_start(monkeypatch, 1.5e-6, 100.0, 100.05)
    monkeypatch.setitem(profit.OP_SHARE, "cpu", 0.5)
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "auto")
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    first = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    loop = next(lp for lp in first.loops if lp.plan.func.name == "saxpy")
    for _ in range(2):
        assert run_case(first.rewritten, "saxpy", spec, case, first) == expected
    assert loop.stats.offloaded == 0 and loop.stats.declined == {NOT_STARTED: 2}
    second = _remembered_then_run_again(first, loop, device)
    second._while_starting._kernels.wait()
    assert run_case(second.rewritten, "saxpy", spec, case, second) == expected
    again = next(lp for lp in second.loops if lp.plan.func.name == "saxpy")
    assert again.stats.on_host == again.stats.offloaded == 1
    assert not second.launched_on_device() and device.made is None  # the GPU's start never begun
    second.close()


def test_standing_in_for_a_gpu_a_kernel_whose_library_is_cached_loads_off_the_compile_workers(
    monkeypatch, tmp_path
) -> None:
    # ~30 ms gained by the model, short of LLVM's start: the first run compiles the kernel
    # with its shared library, for then. The next run loads that library as it begins, on a
    # thread of its own (no compile worker: their pool imports concurrent.futures and
    # logging), and the first arrival launches.
    from tensorwasm.compiler.target.shared import SharedCode, find_linker

    if find_linker() is None:
        pytest.skip("no linker on this machine (ld.lld, ld or cc): kernels load through LLVM")
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    device, first, _ = _saxpy_on_a_slow_start(monkeypatch, 1.5e-6, 100.0, 100.05)
    monkeypatch.setitem(profit.OP_SHARE, "cpu", 0.5)
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "auto")
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    first = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    assert run_case(first.rewritten, "saxpy", spec, case, first) == expected
    loop = next(lp for lp in first.loops if lp.plan.func.name == "saxpy")
    assert (
        loop.stats.on_host == 0
        and first._while_starting.gains.modelled[loop.kernel_index] < known_host.EARLY_GAIN_SECONDS
    )
    second = _remembered_then_run_again(first, loop, device)
    kernels = second._while_starting._kernels
    assert not kernels.pending and loop.kernel_index in kernels._loading
    assert run_case(second.rewritten, "saxpy", spec, case, second) == expected
    again = next(lp for lp in second.loops if lp.plan.func.name == "saxpy")
    assert again.stats.on_host == again.stats.offloaded == 1 and not again.stats.declined
    assert isinstance(kernels.units[loop.kernel_index].code, SharedCode)
    second.close()


def test_a_kernel_the_last_run_measured_slower_on_the_host_backend_stays_on_wasmtime(
    monkeypatch, tmp_path
) -> None:
    # ~30 ms gained an arrival by the model; the last run measured a loss: parked from the first.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    module = _host_module(monkeypatch, 1.5e-6)
    loop = next(lp for lp in module.loops if lp.plan.func.name == "saxpy")
    known_host.remember_kernels(module.key, _gains({}, {loop.kernel_index: -0.01}))
    module.load_host_kernels_early()
    for _ in range(3):
        assert run_case(module.rewritten, "saxpy", spec, case, module) == expected
    assert loop.stats.offloaded == 0 and loop.stats.declined == {
        "its launches ran slower than the CPU would": 3
    }
    module.close()


def test_standing_in_for_a_gpu_a_kernel_the_last_run_measured_slower_stays_on_wasmtime(
    monkeypatch, tmp_path
) -> None:
    # Its shared library in the code cache (where this machine links one), it would launch at
    # its first arrival (see test_while_starting); measured slower last run, it does not.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    device, first, _ = _saxpy_on_a_slow_start(monkeypatch, 1.5e-6, 100.0, 100.05)
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "auto")
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    first = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    assert run_case(first.rewritten, "saxpy", spec, case, first) == expected
    first._while_starting._kernels.wait()  # (compiled for the next run, where a linker is)
    first.close()
    module = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    loop = next(lp for lp in module.loops if lp.plan.func.name == "saxpy")
    known_host.remember_kernels(module.key, _gains({}, {loop.kernel_index: -0.01}))
    module.load_host_kernels_early()
    for _ in range(3):
        assert run_case(module.rewritten, "saxpy", spec, case, module) == expected
    assert loop.stats.offloaded == loop.stats.on_host == 0 and loop.stats.declined == {NOT_STARTED: 3}
    module.close()


def test_a_launch_is_measured_without_its_wait_for_the_host_threads_to_start(monkeypatch, tmp_path) -> None:
    # Starting the launch threads is the process's start (~1 ms a thread where other threads
    # hold the interpreter lock): a first launch that waited for it must not be remembered
    # as slower than wasmtime, which would keep the kernel on wasmtime for the next runs.
    import time

    from tensorwasm.runtime import host_device

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(host_device, "CPUS", 2)
    monkeypatch.setattr(host_device, "_POOL", None)
    monkeypatch.setattr(host_device, "_WARMING", None)
    start_all = host_device._start_all
    monkeypatch.setattr(host_device, "_start_all", lambda: (time.sleep(0.3), start_all()))
    monkeypatch.setattr(
        host_device.HostLaunches, "THREAD_MIN_ITERATIONS", 1
    )  # (saxpy's 4,096 on both threads)
    waits = []
    take = host_device.HostLaunches.take_threads_seconds
    monkeypatch.setattr(
        host_device.HostLaunches, "take_threads_seconds", lambda self: waits.append(take(self)) or waits[-1]
    )
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    module = _host_module(monkeypatch, 1.5e-6)
    for _ in range(2):  # (the second arrival's pays for the host's start: its kernel compiles)
        assert run_case(module.rewritten, "saxpy", spec, case, module) == expected
    module._kernels.wait()
    assert run_case(module.rewritten, "saxpy", spec, case, module) == expected
    loop = next(lp for lp in module.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 1 and loop.stats.threads == 2
    assert waits and waits[0] >= 0.3  # the launch waited for its threads...
    assert module.planner.gains.measured[loop.kernel_index] > -0.1  # ...which its measure leaves out
    module.close()


def test_a_kernels_pace_on_the_host_is_remembered_until_a_launch_measures_it_again() -> None:
    key = "a module whose kernels ran on the host's threads"
    assert known_host.last_run(key)[2] == {}
    gains = _gains(measured={4: 0.02})
    gains.paced(4, 3.5)
    known_host.remember_kernels(key, gains)
    assert known_host.paces_last_time(key) == {4: 3.5}
    again = _gains(measured={6: 0.01})
    again.paced(6, 0.8)
    known_host.remember_kernels(key, again)  # kernel 4 did not launch: its pace stands
    assert known_host.paces_last_time(key) == {4: 3.5, 6: 0.8}
    third = _gains(measured={4: 0.03})
    third.paced(4, 1.25)
    known_host.remember_kernels(key, third)
    assert known_host.paces_last_time(key) == {4: 1.25, 6: 0.8}


@pytest.mark.parametrize("pace", ["-1", "0", '"fast"', "1e999"])
def test_a_record_with_a_pace_that_is_no_positive_ratio_is_dropped(pace: str) -> None:
    from tensorwasm.runtime.cache import default_cache

    key = f"a module whose record was damaged ({pace})"
    gains = _gains(measured={1: 0.5})
    gains.paced(1, 2.0)
    known_host.remember_kernels(key, gains)
    record = known_host._key(key)
    blob = default_cache().get("host-kernels", record).replace(b'"1": 2.0', b'"1": ' + pace.encode())
    default_cache().put("host-kernels", record, blob)
    assert known_host.last_run(key) == ((), set(), {})
    assert default_cache().get("host-kernels", record) is None
