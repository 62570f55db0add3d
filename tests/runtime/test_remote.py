"""The GPU's work in a process of its own (:mod:`runtime.remote`), where a sticky fault
left this process no context. Here the child's device is :mod:`tests.fake_device` (host
memory, kernels in Python), so the transport runs without a GPU; the offload path's switch
to a GPU process after a real fault is ``tests/runtime/test_offload.py``'s gpu test."""

from __future__ import annotations

import ctypes

import pytest

from tensorwasm.runtime.driver import CudaError, KernelParams, ModuleLoadError, NoGPU, StaleHandleError
from tensorwasm.runtime.remote import WorkerContext, WorkerLost

FAKE = "tests.fake_device:make"


@pytest.fixture
def context():
    made = WorkerContext(0, FAKE)
    yield made
    made.close()


def _words(values) -> ctypes.Array:
    return (ctypes.c_uint32 * len(values))(*values)


def _add_one(context: WorkerContext, stream, kernel, buffer, n: int) -> None:
    params = KernelParams([ctypes.c_uint64, ctypes.c_uint32])
    params.set([buffer.ptr, n])
    stream.launch(kernel, (1,), (1,), params)


def test_copies_and_launches_run_in_the_child_in_stream_order(context) -> None:
    kernel = context.load_module(b"add_one").function("add_one")
    buffer = context.mem_alloc(4096)
    host = _words(range(1024))
    stream = context.stream()
    # in, +1, back; in again (it must read what came back), +1, back; then the wait
    for round in range(2):
        stream.copy_htod(buffer.ptr, ctypes.addressof(host), 4096)
        _add_one(context, stream, kernel, buffer, 1024)
        stream.copy_dtoh(ctypes.addressof(host), buffer.ptr, 4096)
        assert list(host[:3]) == [round, round + 1, round + 2]  # the last round waits for the wait
    stream.synchronize()
    assert list(host) == [i + 2 for i in range(1024)]
    assert context.info.name.startswith("fake device (process ")
    assert str(context.pid) in context.info.name  # the child's, not this process's


def test_a_batch_larger_than_the_shared_memory_goes_in_parts(context) -> None:
    context.SHARED_MAX = 4096
    kernel = context.load_module(b"add_one").function("add_one")
    n = 10_000  # 40,000 bytes: ten parts
    buffer = context.mem_alloc(4 * n)
    host = _words(range(n))
    stream = context.stream()
    stream.copy_htod(buffer.ptr, ctypes.addressof(host), 4 * n)
    _add_one(context, stream, kernel, buffer, n)
    stream.copy_dtoh(ctypes.addressof(host), buffer.ptr, 4 * n)
    stream.synchronize()
    assert list(host) == [i + 1 for i in range(n)]
    assert context._shared.size == 4096


def test_the_synchronous_copies_take_buffers_and_addresses(context) -> None:
    buffer = context.mem_alloc(16)
    context.memcpy_htod(buffer.ptr, bytes(range(16)))
    out = bytearray(16)
    context.memcpy_dtoh(out, buffer.ptr)
    assert bytes(out) == bytes(range(16))
    context.memset_d8(buffer.ptr, 0x1AB, 8)
    context.memcpy_dtoh(out, buffer.ptr)
    assert bytes(out) == b"\xab" * 8 + bytes(range(8, 16))


def test_a_recorded_launch_replays_with_the_arguments_it_was_recorded_with(context) -> None:
    kernel = context.load_module(b"add_one").function("add_one")
    buffer = context.mem_alloc(64)
    host = _words([5] * 16)
    params = KernelParams([ctypes.c_uint64, ctypes.c_uint32])
    params.set([buffer.ptr, 4])

    def queue(stream) -> None:
        stream.copy_htod(buffer.ptr, ctypes.addressof(host), 64)
        stream.launch(kernel, (1,), (1,), params)
        stream.copy_dtoh(ctypes.addressof(host), buffer.ptr, 64)

    graph = context.record(queue)
    params.set([buffer.ptr, 16])  # after the recording: not seen by the graph
    for _ in range(3):
        graph.launch(context.stream().handle)
    context.synchronize()
    assert list(host) == [8] * 4 + [5] * 12
    assert context.native_calls() is None  # no graph handle for native replays here
    with pytest.raises(Exception, match="no graph handle"):
        _ = graph.handle


def test_a_sticky_fault_in_the_child_is_reset_by_a_new_child(context) -> None:
    module = context.load_module(b"add_one fault")
    buffer = context.mem_alloc(64)
    module.function("fault").launch((1,), (1,))
    with pytest.raises(CudaError) as info:
        context.synchronize()
    assert info.value.sticky and info.value.error_name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    first = context.pid
    context.reset()
    assert context.pid != first and context.generation == 1
    with pytest.raises(StaleHandleError):
        _ = buffer.ptr
    with pytest.raises(StaleHandleError):
        module.function("add_one")
    kernel = context.load_module(b"add_one").function("add_one")  # the new child works
    buffer = context.mem_alloc(64)
    host = _words([1] * 16)
    stream = context.stream()
    stream.copy_htod(buffer.ptr, ctypes.addressof(host), 64)
    _add_one(context, stream, kernel, buffer, 16)
    stream.copy_dtoh(ctypes.addressof(host), buffer.ptr, 64)
    stream.synchronize()
    assert list(host) == [2] * 16


def test_a_child_that_dies_is_a_sticky_lost_process_and_reset_brings_one_back(context) -> None:
    context.load_module(b"die").function("die").launch((1,), (1,))
    with pytest.raises(WorkerLost) as info:
        context.synchronize()
    assert info.value.sticky and "exit status 3" in str(info.value)
    with pytest.raises(WorkerLost):
        context.mem_alloc(16)  # nothing more goes to the dead child
    context.reset()
    assert context.mem_get_info() == (1 << 30, 1 << 30)


def test_what_a_lost_child_held_is_given_up_without_asking_it(context) -> None:
    import os
    import signal

    module = context.load_module(b"add_one")
    buffer = context.mem_alloc(64)
    os.kill(context.pid, signal.SIGKILL)  # (the kernel's out-of-memory killer, say)
    with pytest.raises(WorkerLost, match="exit status -9"):
        context.mem_get_info()
    assert not context.alive
    buffer.free()  # nothing to ask: no error
    module.unload()


def test_float_arguments_cross_to_the_child_bit_for_bit(context) -> None:
    kernel = context.load_module(b"store_bits").function("store_bits")
    buffer = context.mem_alloc(16)
    out = (ctypes.c_uint8 * 12)()
    for at, ctype, bits in (
        (0, ctypes.c_float, b"\x00\x00\xa0\x7f"),
        (4, ctypes.c_double, b"\x01" + b"\x00" * 5 + b"\xf0\x7f"),
    ):
        params = KernelParams([ctypes.c_uint64, ctype])  # a signalling NaN of each width
        params.slots[0].value = buffer.ptr + at
        ctypes.memmove(ctypes.addressof(params.slots[1]), bits, len(bits))
        kernel.launch((1,), (1,), params)
    context.memcpy_dtoh(out, buffer.ptr, 12)
    assert bytes(out) == b"\x00\x00\xa0\x7f" + b"\x01" + b"\x00" * 5 + b"\xf0\x7f"


def test_errors_in_the_child_reach_the_parent_as_they_were(context) -> None:
    with pytest.raises(ModuleLoadError) as info:
        context.load_module(b"bad")
    assert info.value.log == "line 1: syntax error" and "ptxas -arch=sm_90" in str(info.value)
    module = context.load_module(b"add_one")
    with pytest.raises(CudaError) as missing:
        module.function("nothing")
    assert missing.value.call == "cuModuleGetFunction" and "'nothing'" in str(missing.value)
    assert not missing.value.sticky
    assert context.mem_get_info()  # and the child goes on


def test_a_child_without_a_gpu_is_refused_at_the_start() -> None:
    with pytest.raises(NoGPU, match="zero devices"):
        WorkerContext(0, "tests.fake_device:make_without_gpu")


class _Faults:
    """Simulated modules whose kernels fault while ``on``, on a shared "GPU" whose reset the
    driver refuses, and stand-ins for GPU processes (what WorkerContext answers, in this
    process): the offload path's side of a sticky fault, without a GPU."""

    def __init__(self, monkeypatch) -> None:
        from tensorwasm.oracle.simulated import HostContext, HostKernel
        from tensorwasm.runtime import remote
        from tensorwasm.runtime.device_info import DeviceInfo
        from tensorwasm.runtime.remote import HostBuffer

        self.on, self.resets, self.workers, self.closed = False, [], [], []
        faults = self

        class Faulting(HostKernel):
            def run(self, values: list[int]) -> None:
                if faults.on:
                    raise CudaError("cuStreamSynchronize", 700)  # CUDA_ERROR_ILLEGAL_ADDRESS
                super().run(values)

        class StandIn(HostContext):
            def __init__(self, ordinal: int) -> None:
                super().__init__()
                self.info = DeviceInfo(ordinal, "GPU process", (9, 0), 13000, 1 << 30, 132)
                faults.workers.append(self)

            def mem_alloc(self, nbytes: int) -> HostBuffer:
                return HostBuffer(nbytes)

            def mem_get_info(self) -> tuple[int, int]:
                return 1 << 30, 1 << 30

            def reset(self) -> None:  # a new child
                faults.resets.append(self)
                self.generation += 1
                for watcher in list(self.watchers):
                    watcher.context_reset(self)

            def native_calls(self) -> None:
                return None

            def close(self) -> None:
                faults.closed.append(self)

        class Refusing(HostContext):
            """The process's own context, whose reset the driver refuses."""

            def __init__(self) -> None:
                super().__init__()
                self.info = DeviceInfo(0, "GPU", (9, 0), 13000, 1 << 30, 132)

            def reset(self) -> None:
                self.generation += 1
                for watcher in list(self.watchers):
                    watcher.context_reset(self)
                self.refused = CudaError("cuDevicePrimaryCtxRetain", 700)
                raise self.refused

        self.faulting = Faulting
        monkeypatch.setattr(remote, "WorkerContext", StandIn)
        self.gpu = Refusing()  # the process's own, shared

    def module(self, wasm: bytes):
        """A module on the shared GPU, its kernels loaded as Faulting host kernels."""
        from tensorwasm.oracle.simulated import SimulatedDevice
        from tensorwasm.runtime.offload import OffloadModule

        return OffloadModule(wasm, device=SimulatedDevice(self.gpu, self.faulting), mode="always")


def _saxpy_arrival(offload, n: int) -> None:
    """One call of saxpy with ``n`` elements; its results and memory must be wasmtime's."""
    from tests.offload_cases import SPECS, Case, module_bytes, run_case

    case = Case({"n": n}, [1.5, 0.0], [0, 0], seed=n)
    spec = SPECS["blas1"]["saxpy"]
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(
        module_bytes("blas1", "O2"), "saxpy", spec, case
    )


def _saxpy_loop(offload):
    return next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")


def test_a_module_whose_process_cannot_recover_goes_on_in_a_gpu_process(monkeypatch, caplog) -> None:
    """After a sticky fault the driver will not reset from, later launches run in a GPU
    process (a stand-in here); a fault there restarts that process; past FAULTS_RECOVERED
    faults the loops stay on the CPU. Results are wasmtime's throughout."""
    from tests.offload_cases import module_bytes

    faults = _Faults(monkeypatch)
    offload = faults.module(module_bytes("blas1", "O2"))
    loop = _saxpy_loop(offload)
    faults.on = True
    _saxpy_arrival(offload, 4096)  # faults; the driver refuses a new context: a GPU process takes over
    (worker,) = faults.workers
    assert offload.context is worker and offload.gpu_lost is None
    assert "goes on in a process of its own" in caplog.text
    faults.on = False
    _saxpy_arrival(offload, 4097)
    assert loop.stats.offloaded == 1
    faults.on = True
    _saxpy_arrival(offload, 4098)  # a fault in the GPU process: it is restarted, not replaced
    assert faults.resets == [worker] and offload.context is worker
    faults.on = False
    _saxpy_arrival(offload, 4099)
    assert loop.stats.offloaded == 2
    faults.on = True
    for n in (4100, 4101):  # the third fault is recovered from, the fourth is not
        _saxpy_arrival(offload, n)
    assert (
        offload.faults == offload.launches.FAULTS_RECOVERED + 1
        and len(faults.resets) == offload.launches.FAULTS_RECOVERED - 1
    )
    assert "faulted 4 times" in offload.gpu_lost
    assert faults.closed == [worker] and offload.mirror.memory is None  # given up: nothing kept
    faults.on = False
    _saxpy_arrival(offload, 5000)
    assert loop.stats.offloaded == 2 and loop.stats.declined[offload.gpu_lost] == 1
    offload.close()


def test_a_module_whose_shared_context_another_reset_renews_its_state(monkeypatch) -> None:
    """Two modules on one context: the one that faults resets it (refused: it moves to a GPU
    process); the other finds its device memory stale at its next launch and moves to a GPU
    process of its own, without a fault of its own and without declining."""
    from tests.offload_cases import module_bytes

    faults = _Faults(monkeypatch)
    a, b = faults.module(module_bytes("blas1", "O2")), faults.module(module_bytes("blas1", "O2"))
    _saxpy_arrival(b, 3000)
    stale, generation = b.mirror, b.launches.generation[0]
    faults.on = True
    _saxpy_arrival(a, 4096)  # a faults and resets the shared context
    faults.on = False
    assert stale.stale and b.launches.generation[0] > generation  # told: its native replays go through Python
    _saxpy_arrival(b, 3001)
    _saxpy_arrival(a, 4097)
    worker_a, worker_b = faults.workers
    assert (a.context, b.context) == (worker_a, worker_b)
    assert (a.faults, b.faults) == (1, 0)
    assert _saxpy_loop(b).stats.offloaded == 2 and not _saxpy_loop(b).stats.declined
    assert _saxpy_loop(a).stats.offloaded == 1
