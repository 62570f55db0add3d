"""Tests of runtime.driver, the checked layer over the CUDA driver API.

The first part runs anywhere: it drives the wrappers through stand-ins for single
cuda-python functions, so the error paths and the parameter packing are checked on
machines without a GPU. The tests marked ``gpu`` need a real device; the project's
test command deselects them with ``-m "not gpu"`` where there is none.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu
from cuda.pathfinder import DynamicLibNotFoundError

from tensorwasm.runtime import driver
from tensorwasm.runtime.driver import (
    Context,
    CudaError,
    DeviceBuffer,
    DeviceInfo,
    Kernel,
    ModuleLoadError,
    NoGPU,
    StaleHandleError,
    check,
    devices,
    driver_available,
)
from tensorwasm.support.errors import TensorWasmError

R = cu.CUresult
SUCCESS = (R.CUDA_SUCCESS,)

ADD_ONE_PTX = """
.version 8.0
.target sm_75
.address_size 64

.visible .entry add_one(
    .param .u64 data,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [data];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    add.u32 %r6, %r6, 1;
    st.global.u32 [%rd4], %r6;
DONE:
    ret;
}

.visible .entry trap_now()
{
    trap;
}
"""


@pytest.fixture
def fresh_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the cached cuInit outcome and contexts for the length of one test."""
    monkeypatch.setattr(driver, "_init_failure", None)
    monkeypatch.setattr(Context, "_instances", {})


def _fake_context(monkeypatch: pytest.MonkeyPatch) -> Context:
    """A Context over no device, for tests that replace the driver calls it makes (PTX goes
    to the driver's JIT: no ptxas runs first)."""
    monkeypatch.setattr(cu, "cuCtxSetCurrent", lambda handle: SUCCESS)
    monkeypatch.setenv("TENSORWASM_PTXAS", "off")
    info = DeviceInfo(0, "fake", (9, 0), 13000, 1 << 30, 132)
    return Context(info, device=None, handle=None)


# --- without a GPU ---------------------------------------------------------------


def test_real_environment_reports_gpu_presence_consistently() -> None:
    if driver_available():
        assert devices()
        assert Context.get() is Context.get()
    else:
        assert devices() == []
        with pytest.raises(NoGPU, match="no usable GPU"):
            Context.get()


def _raise_missing_lib(flags: int) -> tuple[Any, ...]:
    raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library')


@pytest.mark.parametrize(
    ("cu_init", "cause"),
    [
        (_raise_missing_lib, "driver library"),
        (lambda flags: (R.CUDA_ERROR_NO_DEVICE,), "CUDA_ERROR_NO_DEVICE"),
        (lambda flags: (R.CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,), "too old"),
        (lambda flags: (R.CUDA_ERROR_STUB_LIBRARY,), "stub"),
    ],
)
@pytest.mark.usefixtures("fresh_driver")
def test_no_gpu_is_typed_and_names_the_cause(
    monkeypatch: pytest.MonkeyPatch, cu_init: Any, cause: str
) -> None:
    monkeypatch.setattr(cu, "cuInit", cu_init)
    assert devices() == []
    assert not driver_available()
    with pytest.raises(NoGPU, match=cause):
        Context.get()


@pytest.mark.usefixtures("fresh_driver")
def test_a_driver_that_starts_does_not_import_the_library_finder(monkeypatch: pytest.MonkeyPatch) -> None:
    # cuda.pathfinder's import (50 to 120 ms on an H100's host) is for a missing library only:
    # a start that succeeds must not wait for it on the way to the first launch.
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", None)  # (importing it now raises)
    monkeypatch.setattr(cu, "cuInit", lambda flags: (R.CUDA_SUCCESS,))
    monkeypatch.setattr(cu, "cuDeviceGetCount", lambda: (R.CUDA_SUCCESS, 1))
    assert driver_available()


@pytest.mark.usefixtures("fresh_driver")
def test_load_bindings_leaves_a_missing_library_to_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cu, "cuDriverGetVersion", lambda: _raise_missing_lib(0))
    driver.load_bindings()  # (the thread that calls it must not die of it)
    monkeypatch.setattr(cu, "cuInit", _raise_missing_lib)
    with pytest.raises(NoGPU, match="driver library"):
        Context.get()


@pytest.mark.usefixtures("fresh_driver")
def test_other_init_failures_are_cuda_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cu, "cuInit", lambda flags: (R.CUDA_ERROR_UNKNOWN,))
    with pytest.raises(CudaError, match="cuInit failed: CUDA_ERROR_UNKNOWN"):
        devices()


def test_check_returns_none_one_value_or_tuple() -> None:
    assert check("cuCtxSynchronize", SUCCESS) is None
    assert check("cuDeviceGetCount", (R.CUDA_SUCCESS, 3)) == 3
    assert check("cuMemGetInfo", (R.CUDA_SUCCESS, 10, 20)) == (10, 20)


def test_check_raises_naming_call_and_error_without_driver_strings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cu, "cuGetErrorName", _raise_missing_lib)
    with pytest.raises(CudaError) as info:
        check("cuMemAlloc", (R.CUDA_ERROR_OUT_OF_MEMORY, None))
    error = info.value
    assert (error.call, error.code) == ("cuMemAlloc", 2)
    assert error.error_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert str(error) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"


def test_check_uses_driver_description_when_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cu, "cuGetErrorName", lambda code: (R.CUDA_SUCCESS, b"CUDA_ERROR_OUT_OF_MEMORY"))
    monkeypatch.setattr(cu, "cuGetErrorString", lambda code: (R.CUDA_SUCCESS, b"out of memory"))
    with pytest.raises(CudaError) as info:
        check("cuMemAlloc", (R.CUDA_ERROR_OUT_OF_MEMORY, None))
    assert str(info.value) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"


def test_error_name_falls_back_when_driver_cannot_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cu, "cuGetErrorName", lambda code: (R.CUDA_ERROR_INVALID_VALUE, None))
    monkeypatch.setattr(cu, "cuGetErrorString", lambda code: (R.CUDA_ERROR_INVALID_VALUE, None))
    assert CudaError("cuX", R.CUDA_ERROR_INVALID_PTX).error_name == "CUDA_ERROR_INVALID_PTX"
    assert CudaError("cuX", 123456).error_name == "CUDA_ERROR_123456"


@pytest.mark.parametrize(
    "name",
    [
        "ILLEGAL_ADDRESS",
        "LAUNCH_FAILED",
        "MISALIGNED_ADDRESS",
        "ILLEGAL_INSTRUCTION",
        "HARDWARE_STACK_ERROR",
        "INVALID_PC",
        "ASSERT",
        "LAUNCH_TIMEOUT",
    ],
)
def test_context_poisoning_errors_are_sticky(name: str) -> None:
    assert CudaError("cuCtxSynchronize", getattr(R, f"CUDA_ERROR_{name}")).sticky


@pytest.mark.parametrize(
    "name", ["OUT_OF_MEMORY", "INVALID_VALUE", "NOT_FOUND", "INVALID_PTX", "LAUNCH_OUT_OF_RESOURCES"]
)
def test_recoverable_errors_are_not_sticky(name: str) -> None:
    assert not CudaError("cuLaunchKernel", getattr(R, f"CUDA_ERROR_{name}")).sticky


def test_module_load_error_carries_log_trimmed_at_nul(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _fake_context(monkeypatch)
    images: list[bytes] = []

    def load(image: bytes, count: int, options: list[Any], values: list[Any]) -> tuple[Any, ...]:
        images.append(image)
        log = values[options.index(cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER)]
        log[:32] = b"ptxas fatal: bad token\0leftover!"
        return R.CUDA_ERROR_INVALID_PTX, None

    monkeypatch.setattr(cu, "cuModuleLoadDataEx", load)
    with pytest.raises(ModuleLoadError) as info:
        context.load_module(".version 8.0\nnonsense")
    assert info.value.log == "ptxas fatal: bad token"
    assert info.value.error_name == "CUDA_ERROR_INVALID_PTX"
    assert "ptxas fatal: bad token" in str(info.value)
    assert "leftover" not in str(info.value)
    assert images == [b".version 8.0\nnonsense\0"]


def test_module_remembers_its_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _fake_context(monkeypatch)
    monkeypatch.setattr(cu, "cuModuleLoadDataEx", lambda *args: (R.CUDA_SUCCESS, object()))
    monkeypatch.setattr(cu, "cuModuleGetFunction", lambda module, name: (R.CUDA_ERROR_NOT_FOUND, None))
    module = context.load_module(ADD_ONE_PTX)
    assert module.entries == ("add_one", "trap_now")
    with pytest.raises(CudaError, match=r"'missing' .*add_one, trap_now"):
        module.function("missing")


def test_copies_are_cut_where_page_locked_registrations_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorwasm.runtime.driver import Stream

    context = _fake_context(monkeypatch)
    copies: list[tuple[str, int, int, int]] = []
    monkeypatch.setattr(cu, "cuMemHostRegister", lambda base, nbytes, flags: SUCCESS)
    monkeypatch.setattr(cu, "cuMemHostUnregister", lambda base: SUCCESS)
    for name, way in (("cuMemcpyHtoDAsync", "in"), ("cuMemcpyDtoHAsync", "out")):
        monkeypatch.setattr(
            cu, name, lambda dst, src, n, s, way=way: copies.append((way, dst, src, n)) or SUCCESS
        )
    assert context.host_register(0x10000, 0x1000) and context.host_register(0x11000, 0x1000)
    stream = Stream(context, 7)
    stream.copy_htod(0xD0000, 0x10800, 0x1000)  # across the point where the two meet
    stream.copy_dtoh(0x10100, 0xD0100, 0x100)  # inside one
    assert copies == [
        ("in", 0xD0000, 0x10800, 0x800), ("in", 0xD0800, 0x11000, 0x800), ("out", 0x10100, 0xD0100, 0x100)
    ]  # fmt: skip
    context.host_unregister(0x10000)
    context.host_unregister(0x11000)
    copies.clear()
    stream.copy_htod(0xD0000, 0x10800, 0x1000)  # nothing page-locked: one copy
    assert copies == [("in", 0xD0000, 0x10800, 0x1000)]


def test_launch_packs_each_argument_behind_a_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _fake_context(monkeypatch)
    buffer = DeviceBuffer(context, 0xDEAD0000, 64)
    seen: dict[str, Any] = {}

    def launch(f: Any, *rest: Any) -> tuple[Any, ...]:
        *dims, shared, stream, params, extra = rest
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        kinds = [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_double, ctypes.c_uint64]
        seen["args"] = [kind.from_address(slots[i]).value for i, kind in enumerate(kinds)]
        seen["dims"] = (*dims, shared, stream, extra)
        return SUCCESS

    monkeypatch.setattr(cu, "cuLaunchKernel", launch)
    module = driver.Module(context, handle=None, entries=("k",))
    Kernel(module, "k", handle=None).launch(
        grid=(8,),
        block=(128, 2),
        args=[
            ctypes.c_uint64(0x1000),
            (ctypes.c_int32, -5),
            ctypes.c_float(1.5),
            (ctypes.c_double, 2.25),
            buffer,
        ],
        shared_mem=256,
    )
    assert seen["args"] == [0x1000, -5, 1.5, 2.25, 0xDEAD0000]
    assert seen["dims"] == (8, 1, 1, 128, 2, 1, 256, 0, 0)


def test_stale_handles_are_refused_after_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _fake_context(monkeypatch)
    for call in ("cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRelease"):
        monkeypatch.setattr(cu, call, lambda device: SUCCESS)
    monkeypatch.setattr(cu, "cuDevicePrimaryCtxRetain", lambda device: (R.CUDA_SUCCESS, None))
    buffer = DeviceBuffer(context, 0x1000, 16)
    context.reset()
    with pytest.raises(StaleHandleError, match="reset"):
        _ = buffer.ptr
    buffer.free()  # the reset already released the memory: nothing to do, no error


def test_host_copy_rejects_read_only_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _fake_context(monkeypatch)
    with pytest.raises(TensorWasmError, match="read-only"):
        context.memcpy_dtoh(b"\0" * 4, 0x1000)
    with pytest.raises(TensorWasmError, match="overruns"):
        context.memcpy_htod(0x1000, bytearray(4), nbytes=8)


# --- on a GPU ---------------------------------------------------------------------


@pytest.fixture
def ctx() -> Context:
    return Context.get()


@pytest.mark.gpu
def test_lists_a_modern_device() -> None:
    listed = devices()
    assert listed, "no GPU found"
    info = listed[0]
    assert info.compute_capability >= (7, 5)
    assert info.name and info.total_memory > 0 and info.multiprocessor_count > 0
    assert info.driver_version >= 12000


@pytest.mark.gpu
def test_memset_and_copy_round_trip_one_mib(ctx: Context) -> None:
    nbytes = 1 << 20
    data = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    with ctx.mem_alloc(nbytes) as buffer:
        ctx.memset_d8(buffer.ptr, 0xAB, nbytes)
        filled = bytearray(nbytes)
        ctx.memcpy_dtoh(filled, buffer.ptr)
        assert filled == b"\xab" * nbytes
        ctx.memcpy_htod(buffer.ptr, data)
        back = np.empty_like(data)
        ctx.memcpy_dtoh(back, buffer.ptr)
    np.testing.assert_array_equal(back, data)


@pytest.mark.gpu
def test_hand_written_kernel_adds_one(ctx: Context) -> None:
    n = 1000
    values = np.arange(n, dtype=np.uint32) * 7
    module = ctx.load_module(ADD_ONE_PTX)
    kernel = module.function("add_one")
    assert kernel.attributes.num_regs > 0
    with ctx.mem_alloc(values.nbytes) as buffer:
        ctx.memcpy_htod(buffer.ptr, values)
        kernel.launch(
            grid=((n + 127) // 128,),
            block=(128,),
            args=[ctypes.c_uint64(buffer.ptr), (ctypes.c_uint32, n)],
        )
        ctx.synchronize()
        result = np.empty_like(values)
        ctx.memcpy_dtoh(result, buffer.ptr)
    module.unload()
    np.testing.assert_array_equal(result, values + 1)


def _assert_context_works(ctx: Context) -> None:
    with ctx.mem_alloc(256) as buffer:
        ctx.memset_d8(buffer.ptr, 7, 256)
        out = bytearray(256)
        ctx.memcpy_dtoh(out, buffer.ptr)
    assert out == b"\x07" * 256


@pytest.mark.gpu
def test_garbage_ptx_raises_with_jit_log(ctx: Context) -> None:
    with pytest.raises(ModuleLoadError) as info:
        ctx.load_module(".version 8.0\n.target sm_75\n.address_size 64\nthis is not ptx;")
    assert info.value.log
    assert info.value.log in str(info.value)
    _assert_context_works(ctx)


@pytest.mark.gpu
def test_huge_allocation_is_out_of_memory_and_recoverable(ctx: Context) -> None:
    with pytest.raises(CudaError) as info:
        ctx.mem_alloc(1 << 50)
    assert info.value.error_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert info.value.call == "cuMemAlloc"
    assert not info.value.sticky
    free, total = ctx.mem_get_info()
    assert 0 < free <= total
    _assert_context_works(ctx)


@pytest.mark.gpu
def test_context_works_from_another_thread(ctx: Context) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            assert Context.get() is ctx
            _assert_context_works(ctx)
        except BaseException as exc:
            # A failure in a thread would otherwise be lost; the main thread reports it.
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors


@pytest.mark.gpu
def test_trap_is_sticky_and_reset_recovers() -> None:
    # A sticky fault poisons the process's context: run it in a process of its own so no
    # other test shares the poisoned (then reset) context.
    code = textwrap.dedent(
        """
        import pytest
        from tensorwasm.runtime.driver import Context, CudaError, StaleHandleError
        from tests.runtime.test_driver import ADD_ONE_PTX, _assert_context_works
        ctx = Context.get()
        module = ctx.load_module(ADD_ONE_PTX)
        stale = ctx.mem_alloc(64)
        with pytest.raises(CudaError) as info:
            module.function("trap_now").launch(grid=(1,), block=(1,))
            ctx.synchronize()
        assert info.value.sticky, info.value
        try:
            ctx.reset()
        except CudaError as exc:
            # Drivers that poison the whole process say so, clearly, instead of hanging.
            assert "a new process is needed" in str(exc), exc
            print("poisoned")
        else:
            with pytest.raises(StaleHandleError):
                module.function("add_one")
            with pytest.raises(StaleHandleError):
                _ = stale.ptr
            _assert_context_works(ctx)
            print("recovered")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recovered" in proc.stdout or "poisoned" in proc.stdout


@pytest.mark.gpu
def test_cubin_from_the_jit_linker_loads_and_runs(ctx: Context) -> None:
    cubin = ctx.link_cubin(ADD_ONE_PTX)
    assert cubin[:4] == b"\x7fELF"  # a device ELF image, not PTX
    kernel = ctx.load_cubin(cubin, ("add_one",)).function("add_one")
    values = np.arange(64, dtype=np.uint32)
    with ctx.mem_alloc(values.nbytes) as buffer:
        ctx.memcpy_htod(buffer.ptr, values)
        kernel.launch(grid=(1,), block=(64,), args=[ctypes.c_uint64(buffer.ptr), (ctypes.c_uint32, 64)])
        ctx.synchronize()
        ctx.memcpy_dtoh(values, buffer.ptr)
    np.testing.assert_array_equal(values, np.arange(1, 65, dtype=np.uint32))


@pytest.mark.gpu
def test_cubin_cache_hit_skips_the_jit_and_a_refused_cubin_is_rebuilt(
    ctx: Context, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorwasm.runtime.cache import Cache, kernels_cubin_key, load_kernels

    cache = Cache(tmp_path)
    load_kernels(ctx, ADD_ONE_PTX.encode(), cache)
    assert (cache.hits, cache.misses) == (0, 1)
    monkeypatch.setattr(Context, "link_cubin", lambda *a: pytest.fail("cubin cache missed"))
    assert "add_one" in load_kernels(ctx, ADD_ONE_PTX.encode(), Cache(tmp_path)).entries
    monkeypatch.undo()
    key = kernels_cubin_key(ctx, ADD_ONE_PTX.encode())
    Cache(tmp_path).put("cubin", key, b"\x7fELF not a cubin")  # hash-valid, driver-invalid
    fresh = Cache(tmp_path)
    module = load_kernels(ctx, ADD_ONE_PTX.encode(), fresh)
    assert module.function("add_one") is not None and fresh.hits == 1
    assert (
        Cache(tmp_path).get("cubin", key)[:4] == b"\x7fELF" and len(Cache(tmp_path).get("cubin", key)) > 100
    )


@pytest.mark.gpu
def test_allocation_over_the_instance_cap_is_refused_before_the_driver(ctx: Context) -> None:
    from tensorwasm.runtime.limits import DeviceAllocator, DeviceMemoryLimitError, DeviceOutOfMemory

    allocator = DeviceAllocator(ctx, limit=3 << 20)
    first = allocator.alloc(2 << 20)
    free_before, _ = ctx.mem_get_info()
    with pytest.raises(DeviceMemoryLimitError, match="cap"):
        allocator.alloc(2 << 20)
    assert ctx.mem_get_info()[0] == free_before  # nothing was allocated
    allocator.free(first)
    second = allocator.alloc(3 << 20)  # within the cap again
    assert allocator.used == 3 << 20
    allocator.free(second)
    with pytest.raises(DeviceOutOfMemory, match="free"):
        DeviceAllocator(ctx).alloc(ctx.info.total_memory * 2)
    with ctx.mem_alloc(1 << 20):  # the context is healthy
        pass
