"""A remembered GPU: a warm start makes its target without waiting for the CUDA context,
checks the context at the first launch, and a run that never launches never waits."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import tensorwasm.runtime.cuda_device as cuda_device
from tensorwasm.runtime import driver, known_gpu
from tensorwasm.runtime.cache import default_cache
from tensorwasm.runtime.driver import DeviceInfo, NoGPU
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import ROOT
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case

H100 = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 13000, 80 << 30, 132)
A100 = DeviceInfo(0, "NVIDIA A100-SXM4-40GB", (8, 0), 13000, 40 << 30, 108)


def _fake_system(root: Path, driver_version: str = "580.95.05", uuid: str = "GPU-1") -> None:
    (root / "proc/gpus/0000:1a:00.0").mkdir(parents=True, exist_ok=True)
    (root / "proc/version").write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}\n")
    (root / "proc/gpus/0000:1a:00.0/information").write_text(f"Model: NVIDIA H100\nGPU UUID: {uuid}\n")
    for name, vendor, klass, device in (("0000:1a:00.0", "0x10de", "0x030200", "0x2330"),
                                        ("0000:00:1f.0", "0x8086", "0x060100", "0x1234")):  # fmt: skip
        entry = root / "pci" / name
        entry.mkdir(parents=True, exist_ok=True)
        for field, value in (("vendor", vendor), ("class", klass), ("device", device)):
            (entry / field).write_text(value + "\n")
    known_gpu._fingerprint.cache_clear()  # read once per process otherwise


@pytest.fixture
def system(tmp_path: Path, monkeypatch) -> Path:
    """A machine with one NVIDIA GPU as the operating system describes it, and a cache."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_system(tmp_path)
    monkeypatch.setattr(known_gpu, "PROC", tmp_path / "proc")
    monkeypatch.setattr(known_gpu, "SYS_MODULE", tmp_path / "absent")
    monkeypatch.setattr(known_gpu, "PCI", tmp_path / "pci")
    return tmp_path


def test_a_device_is_remembered_until_the_driver_the_gpus_or_the_selection_change(
    system, monkeypatch
) -> None:
    assert known_gpu.remembered() is None
    known_gpu.remember(H100)
    assert known_gpu.remembered() == H100
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert known_gpu.remembered() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden
    assert known_gpu.remembered() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _fake_system(system, uuid="GPU-2")  # another GPU in the same slot
    assert known_gpu.remembered() is None
    _fake_system(system, uuid="GPU-1", driver_version="590.1")
    assert known_gpu.remembered() is None
    _fake_system(system)
    assert known_gpu.remembered() == H100


def test_nothing_is_remembered_where_the_system_names_no_nvidia_device(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(known_gpu, "PROC", tmp_path / "no-proc")
    monkeypatch.setattr(known_gpu, "SYS_MODULE", tmp_path / "no-module")
    assert known_gpu.fingerprint() is None
    known_gpu.remember(H100)
    assert known_gpu.remembered() is None


@pytest.fixture
def bare(tmp_path: Path, monkeypatch) -> Path:
    """A machine whose system shows no NVIDIA driver, device node or GPU, and a cache."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, path in (("PROC", "proc"), ("SYS_MODULE", "module"), ("PCI", "pci"), ("DEV", "dev"),
                       ("WSL_LIBRARIES", "wsl"), ("LINKER_CACHE", "ld.so.cache")):  # fmt: skip
        monkeypatch.setattr(known_gpu, name, tmp_path / path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/null").touch()
    (tmp_path / "ld.so.cache").touch()
    known_gpu._absence.cache_clear()
    return tmp_path


def _absence_after(change) -> str | None:
    change()
    known_gpu._absence.cache_clear()  # read once per process otherwise
    return known_gpu.remembered_absence()


def test_no_gpu_is_remembered_until_what_could_bring_one_changes(bare, monkeypatch) -> None:
    reason = "no usable GPU: the driver reports zero devices"
    assert known_gpu.remembered_absence() is None
    known_gpu.remember_absence(reason)
    assert known_gpu.remembered_absence() == reason
    assert _absence_after(lambda: (bare / "dev/nvidia0").touch()) is None  # a device node
    assert _absence_after(lambda: (bare / "dev/nvidia0").unlink()) == reason
    assert _absence_after(lambda: (bare / "dev/dxg").touch()) is None  # WSL's
    assert _absence_after(lambda: (bare / "dev/dxg").unlink()) == reason
    (bare / "module").write_text("580.95.05\n")  # the NVIDIA kernel module, loaded
    assert _absence_after(lambda: None) is None
    assert _absence_after(lambda: (bare / "module").unlink()) == reason
    assert _absence_after(lambda: monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/cuda/lib64")) is None
    assert _absence_after(lambda: monkeypatch.delenv("LD_LIBRARY_PATH")) == reason
    assert _absence_after(lambda: monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")) is None
    assert _absence_after(lambda: monkeypatch.delenv("CUDA_VISIBLE_DEVICES")) == reason
    (bare / "wsl").mkdir()
    assert _absence_after(lambda: (bare / "wsl/libcuda.so.1").touch()) is None  # WSL's driver, installed
    assert _absence_after(lambda: (bare / "wsl/libcuda.so.1").unlink()) == reason
    import os

    later = (bare / "ld.so.cache").stat().st_mtime_ns + 10**9
    assert (
        _absence_after(lambda: os.utime(bare / "ld.so.cache", ns=(later, later))) is None
    )  # a library installed


def test_auto_asks_the_driver_once_where_there_is_no_gpu(bare, monkeypatch, capfd) -> None:
    from tensorwasm.runtime.run import pick_device

    asked = []

    def no_gpu(ordinal: int = 0):
        asked.append(ordinal)
        raise NoGPU("no usable GPU: the driver reports zero devices")

    monkeypatch.setattr(driver.Context, "get", staticmethod(no_gpu))
    monkeypatch.setattr(driver.Context, "made", staticmethod(lambda ordinal=0: None))
    first, second = pick_device("auto"), pick_device("auto")  # the second: remembered
    assert len(asked) == 1
    assert first == (
        "cpu",
        "no usable GPU: the driver reports zero devices; loops run on the host backend (cpu)",
    )
    assert second[0] == "cpu"
    assert second[1].startswith("no usable GPU: the driver reports zero devices (last time; --device gpu")
    assert capfd.readouterr().err == ""  # said by the caller (the CLI prints it)
    (bare / "dev/nvidia0").touch()  # a GPU may be there now: asked again
    known_gpu._absence.cache_clear()
    assert pick_device("auto")[0] == "cpu" and len(asked) == 2


def test_no_gpu_is_not_remembered_where_asking_made_a_device_node_or_the_device_was_busy(
    bare, monkeypatch
) -> None:
    """The driver, asked, may load the kernel module and make the device nodes
    (nvidia-modprobe) and still fail: the fingerprint is taken after it was asked. A busy
    device, or a system not ready yet, is no lasting absence."""
    from tensorwasm.runtime.run import pick_device

    def no_gpu(reason: str, node: bool = False):
        def get(ordinal: int = 0):
            if node:
                (bare / "dev/nvidia0").touch()
            raise NoGPU(reason)

        monkeypatch.setattr(driver.Context, "get", staticmethod(get))

    monkeypatch.setattr(driver.Context, "made", staticmethod(lambda ordinal=0: None))
    no_gpu("no usable GPU: the driver reports zero devices", node=True)
    assert known_gpu.absence_fingerprint() is not None  # (read before the driver was asked)
    assert pick_device("auto")[0] == "cpu" and known_gpu.remembered_absence() is None
    (bare / "dev/nvidia0").unlink()
    known_gpu._absence.cache_clear()
    busy = "no usable GPU: the device is busy or in exclusive mode [CUDA_ERROR_DEVICE_UNAVAILABLE]"
    assert not NoGPU(busy).lasting and NoGPU("no usable GPU: the driver reports zero devices").lasting
    no_gpu(busy)
    assert pick_device("auto")[0] == "cpu" and known_gpu.remembered_absence() is None


class FakeContext:
    """The CUDA context as far as preparing and checking code needs one."""

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info


class FakeCode:
    def __init__(self, ptx: bytes) -> None:
        self.ptx = ptx

    def function(self, name: str) -> str:
        return name


@pytest.fixture
def contexts(monkeypatch):
    """Context.get made to count its calls and hand out a fake context (``made`` reports
    it only once it was asked for); the driver's JIT load faked."""
    made: list[FakeContext] = []
    device = {"info": H100}

    def get(ordinal: int = 0):
        if not made:
            made.append(FakeContext(device["info"]))
        return made[0]

    monkeypatch.setattr(driver.Context, "get", staticmethod(get))
    monkeypatch.setattr(driver.Context, "made", staticmethod(lambda ordinal=0: made[0] if made else None))
    monkeypatch.setattr(cuda_device, "load_kernels", lambda context, ptx: FakeCode(ptx))
    return made, device


def _warm(wasm: bytes, made: list, **options) -> OffloadModule:
    """A module prepared once with the context, then again as a new process would."""
    OffloadModule(wasm, device="gpu", **options)
    made.clear()
    default_cache().memory.clear()
    return OffloadModule(wasm, device="gpu", **options)


def test_a_warm_start_on_a_remembered_gpu_waits_for_no_context(system, contexts) -> None:
    made, _ = contexts
    prepared = _warm(module_bytes("blas1", "O2"), made)
    assert not made  # the target came from the remembered description
    assert prepared.target.arch == "sm_90" and prepared.mirror is None
    assert prepared.context is made[0]  # made at first need
    assert not prepared.kernels.units  # nothing compiled before a launch needs it
    assert b".target sm_90" in prepared.kernels.unit(prepared.loops[0].kernel_index).ptx


def test_a_context_unlike_the_remembered_gpu_gets_code_made_for_it(system, contexts) -> None:
    made, device = contexts
    wasm = module_bytes("blas1", "O2")
    device["info"] = A100
    prepared = _warm(wasm, made)  # remembered: the A100
    device["info"] = H100  # the machine's GPU now, its /proc files unchanged
    assert prepared.target.arch == "sm_80" and not made
    entries = [lp.entry for lp in prepared.loops]
    first = prepared.loops[0].kernel_index
    assert b".target sm_80" in prepared.kernels.unit(first).ptx  # compiled before the context
    assert prepared.kernels[entries[0]] == entries[0]  # its load makes the context: the H100's
    assert made and prepared.target.arch == "sm_90"
    assert b".target sm_90" in prepared.backend.cu_modules[entries[0]].ptx  # not the sm_80 code
    assert [lp.entry for lp in prepared.loops] == entries
    assert [prepared.kernels[e] for e in entries] == entries  # each loaded from its own code
    assert all(b".target sm_90" in prepared.backend.cu_modules[e].ptx for e in entries)


def test_declined_arrivals_on_a_remembered_gpu_make_no_context(system, contexts) -> None:
    made, _ = contexts
    wasm = module_bytes("blas1", "O2")
    prepared = _warm(wasm, made, mode="auto")
    spec, case = _saxpy_case(8)  # far too little work for a launch
    assert run_case(prepared.rewritten, "saxpy", spec, case, prepared) == run_case(wasm, "saxpy", spec, case)
    loop = next(lp for lp in prepared.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.declined == {"too little work to pay for a launch": 1}
    assert not made


def test_a_remembered_gpu_that_is_gone_sends_the_loops_to_the_cpu(system, contexts, monkeypatch) -> None:
    made, _ = contexts
    wasm = module_bytes("blas1", "O2")
    prepared = _warm(wasm, made)

    def gone(ordinal: int = 0):
        raise NoGPU("no usable GPU: the driver sees no device (check CUDA_VISIBLE_DEVICES)")

    monkeypatch.setattr(driver.Context, "get", staticmethod(gone))
    spec, case = _saxpy_case(4096)
    for _ in range(2):
        assert run_case(prepared.rewritten, "saxpy", spec, case, prepared) == run_case(
            wasm, "saxpy", spec, case
        )
    loop = next(lp for lp in prepared.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 0
    assert loop.stats.declined == {"no usable GPU: the driver sees no device (check CUDA_VISIBLE_DEVICES)": 2}


def test_a_device_failing_at_the_first_launch_sends_the_loops_to_the_cpu(
    system, contexts, monkeypatch
) -> None:
    from tensorwasm.runtime.driver import CudaError

    made, _ = contexts
    wasm = module_bytes("blas1", "O2")
    prepared = _warm(wasm, made)

    def out_of_memory(ordinal: int = 0):
        raise CudaError("cuDevicePrimaryCtxRetain", 2)  # CUDA_ERROR_OUT_OF_MEMORY: not sticky

    monkeypatch.setattr(driver.Context, "get", staticmethod(out_of_memory))
    spec, case = _saxpy_case(4096)
    assert run_case(prepared.rewritten, "saxpy", spec, case, prepared) == run_case(wasm, "saxpy", spec, case)
    loop = next(lp for lp in prepared.loops if lp.plan.func.name == "saxpy")
    (reason,) = loop.stats.declined
    assert reason.startswith("the GPU cannot be used: cuDevicePrimaryCtxRetain failed")


def test_a_driver_too_old_for_any_target_sends_the_loops_to_the_cpu(system, contexts) -> None:
    made, device = contexts
    wasm = module_bytes("blas1", "O2")
    prepared = _warm(wasm, made)
    device["info"] = DeviceInfo(0, "NVIDIA H100", (9, 0), 10020, 80 << 30, 132)  # CUDA 10.2
    spec, case = _saxpy_case(4096)
    assert run_case(prepared.rewritten, "saxpy", spec, case, prepared) == run_case(wasm, "saxpy", spec, case)
    loop = next(lp for lp in prepared.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 0 and "driver" in prepared.gpu_lost


def test_a_cold_start_on_a_remembered_gpu_that_is_gone_is_a_warm_one(
    system, contexts, monkeypatch, capfd
) -> None:
    """A cold start compiles no kernel before a launch, so it needs no context either: as a
    warm start, it finds the GPU gone at its first launch, and wasmtime runs the loops."""
    from tensorwasm.runtime.run import prepare

    known_gpu.remember(H100)
    reason = "no usable GPU: the driver sees no device (check CUDA_VISIBLE_DEVICES)"

    def gone(ordinal: int = 0):
        raise NoGPU(reason)

    monkeypatch.setattr(driver.Context, "get", staticmethod(gone))
    wasm = module_bytes("blas1", "O2")
    prepared, note = prepare(wasm, "auto", mode="always")
    assert prepared.device == "gpu" and note is None and not prepared.kernels.units
    assert capfd.readouterr().err == ""
    spec, case = _saxpy_case(4096)
    for _ in range(2):
        assert run_case(prepared.rewritten, "saxpy", spec, case, prepared) == run_case(
            wasm, "saxpy", spec, case
        )
    loop = next(lp for lp in prepared.loops if lp.plan.func.name == "saxpy")
    assert loop.stats.offloaded == 0 and loop.stats.declined == {reason: 2}
    assert prepared.kernels.counts.compiled == 1  # the first arrival's; none once the GPU is known lost


def test_auto_picks_a_remembered_gpu_without_waiting_for_it(system, contexts) -> None:
    from tensorwasm.runtime.run import pick_device

    made, _ = contexts
    known_gpu.remember(H100)
    assert pick_device("auto") == ("gpu", None) and not made


_SLOW_CUDA = """
import sys, threading, time, tensorwasm.runtime.cli as cli
cli._start_cuda = lambda: time.sleep(60)  # a driver still initialising when the run ends
# Run by the interpreter's shutdown (which joins threads), not by atexit's functions.
threading._register_atexit(lambda: print("python finalization", file=sys.stderr))
cli.entry()
"""


def test_a_run_done_before_the_cuda_context_ends_without_waiting_for_it(tmp_path) -> None:
    import os

    from tests.runtime.test_run import plain_wasmtime

    path = ROOT / "examples/wasi/build/histogram.O2.wasm"
    # A cache of its own: one that remembers no GPU here would start no thread at all.
    env = dict(os.environ, TENSORWASM_CACHE_DIR=str(tmp_path / "cache"))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _SLOW_CUDA, "run", str(path), "3000", "--device", "auto", "--report", "text"],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=50, env=env,
    )  # fmt: skip
    assert time.perf_counter() - start < 50
    status, expected = plain_wasmtime(path, ["3000"], tmp_path)
    assert done.returncode == status, done.stderr
    assert done.stdout == expected  # flushed before the process ended
    assert "offload report" in done.stderr
    assert "python finalization" not in done.stderr  # it ended at once
    on_cpu = subprocess.run(
        [sys.executable, "-c", _SLOW_CUDA, "run", str(path), "3000", "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=50, env=env,
    )  # fmt: skip
    # No thread of its own left either: it ends as soon, its output all there (a thread still
    # working is waited for: tests/runtime/test_warm_start.py).
    assert on_cpu.returncode == status and on_cpu.stdout == expected
    assert "python finalization" not in on_cpu.stderr


_RUN = """
import sys
from tensorwasm.runtime import driver, known_gpu
from tensorwasm.runtime.run import run
status, prepared, _ = run(open(sys.argv[1], "rb").read(), sys.argv[1:3], device="gpu", offload=sys.argv[3])
offloaded = sum(lp.stats.offloaded for lp in prepared.loops)
print(known_gpu.fingerprint() is not None, driver.Context.made() is not None, offloaded, file=sys.stderr)
"""


@pytest.mark.gpu
def test_on_the_gpu_a_warm_run_makes_its_context_only_to_launch(tmp_path) -> None:
    import os

    from tests.runtime.test_run import plain_wasmtime

    env = dict(os.environ, TENSORWASM_CACHE_DIR=str(tmp_path / "cache"))

    def tensorwasm(name: str, arg: str, offload: str) -> tuple[str, list[str]]:
        path = ROOT / f"examples/wasi/build/{name}.O2.wasm"
        done = subprocess.run([sys.executable, "-c", _RUN, str(path), arg, offload],
                              capture_output=True, text=True, cwd=ROOT, env=env, check=True)  # fmt: skip
        assert done.stdout == plain_wasmtime(path, [arg], tmp_path)[1]
        return done.stdout, done.stderr.splitlines()[-1].split()

    assert tensorwasm("histogram", "3000", "auto")[1] == ["True", "True", "0"]  # cold: it asked the context
    assert tensorwasm("histogram", "3000", "auto")[1] == [
        "True",
        "False",
        "0",
    ]  # warm: remembered, never needed
    _, (known, made, offloaded) = tensorwasm("matmul", "64", "always")
    assert (known, made) == ("True", "True") and int(offloaded) > 0


def test_a_run_makes_no_cuda_thread_where_the_modules_last_run_here_launched_nothing(
    system, contexts, monkeypatch, capfd
) -> None:
    import tensorwasm.tensorwasm.runtime.cli as cli

    started: list[int] = []
    monkeypatch.setattr(cli, "_start_cuda", lambda: started.append(1))
    monkeypatch.setattr(cli, "_cuda_start", None)
    path = ROOT / "examples/wasi/build/histogram.O2.wasm"

    def threads_of_a_run() -> int:
        contexts[0].clear()  # each run is a process of its own: no context made yet
        before = len(started)
        assert cli.main(["run", str(path), "3000", "--device", "auto"]) == 0
        if cli._cuda_start is not None:
            cli._cuda_start.join()
        return len(started) - before

    assert threads_of_a_run() == 1  # nothing remembered: the context is needed to pick the target
    known_gpu.remember(H100)
    assert known_gpu.launched_last_time(path.read_bytes()) is False  # every loop declined
    assert threads_of_a_run() == 0
    known_gpu.remember_launches(path.read_bytes(), True)
    assert threads_of_a_run() == 1
    assert known_gpu.launched_last_time(path.read_bytes()) is False
    assert known_gpu.launched_last_time(path.read_bytes() + b"\0") is None  # another module
    capfd.readouterr()


def test_a_run_whose_arrivals_would_have_paid_for_the_start_is_remembered_as_launching(
    system, contexts, monkeypatch, capfd
) -> None:
    # Every loop stayed on the CPU, but the gains of arrivals that would have paid for a
    # launch reached the device's whole start: the next run begins the start with the program.
    import tensorwasm.tensorwasm.runtime.cli as cli
    from tensorwasm.runtime.planning import ArrivalPlanner

    monkeypatch.setattr(cli, "_start_cuda", lambda: None)
    monkeypatch.setattr(cli, "_cuda_start", None)
    path = ROOT / "examples/wasi/build/histogram.O2.wasm"
    known_gpu.remember(H100)
    for would_pay in (False, True, False):
        monkeypatch.setattr(ArrivalPlanner, "start_would_pay", lambda self, pay=would_pay: pay)
        contexts[0].clear()
        assert cli.main(["run", str(path), "3000", "--device", "auto"]) == 0
        assert known_gpu.launched_last_time(path.read_bytes()) is would_pay
    capfd.readouterr()


def test_the_start_would_pay_once_the_banked_gains_reach_the_whole_start() -> None:
    from tensorwasm.runtime import profit
    from tensorwasm.runtime.planning import ArrivalPlanner

    class Runner:
        run = transfer_estimate = record_replay = None

    planner = ArrivalPlanner("auto", "gpu", Runner())
    planner.banked = profit.STARTUP_SECONDS["gpu"] * 0.99
    assert not planner.start_would_pay()
    planner.banked = profit.STARTUP_SECONDS["gpu"]
    assert planner.start_would_pay()


def test_the_start_would_pay_where_a_launch_was_worth_waiting_for_the_context() -> None:
    # Wherever it ran (the host's threads may have beaten the wait): without the start begun
    # with the program, the next run's launches would wait longer, or run on the host's threads.
    from tensorwasm.runtime.planning import ArrivalPlanner

    class Runner:
        run = transfer_estimate = record_replay = None

    planner = ArrivalPlanner("auto", "gpu", Runner())
    assert not planner.start_would_pay()
    planner.worth_waiting = True
    assert planner.start_would_pay()


def test_the_start_would_pay_where_the_gains_after_a_context_begun_with_the_program_reach_a_share(
    monkeypatch,
) -> None:
    # Arrivals whose launches would pay: the first ones before a context begun with the
    # program could be made, then as many after it; together less than the whole start.
    from tensorwasm.runtime import planning, profit
    from tensorwasm.runtime.planning import NOT_STARTED, ArrivalPlanner

    class Runner:
        run = transfer_estimate = record_replay = None

        def startup_seconds(self) -> float:
            return profit.STARTUP_SECONDS["gpu"]

    planner = ArrivalPlanner("auto", "gpu", Runner())
    gain = ArrivalPlanner.LATE_SHARE * profit.STARTUP_SECONDS["gpu"] / 4
    now = planning.LOADED
    monkeypatch.setattr(planning.time, "perf_counter", lambda: now)
    for _ in range(3):
        assert planner._started(gain) == NOT_STARTED
    assert planner.banked_late == 0.0 and not planner.start_would_pay()
    now = planning.LOADED + profit.CONTEXT_SECONDS["gpu"] + 1e-3  # (past it whatever LOADED's rounding)
    for _ in range(4):
        assert not planner.start_would_pay()
        assert planner._started(gain) == NOT_STARTED
    assert planner.banked < profit.STARTUP_SECONDS["gpu"] and planner.start_would_pay()
