"""A device for :mod:`runtime.remote`'s child where there is no GPU: its "device memory" is
the child's host memory and its kernels are the Python functions in :data:`KERNELS`,
named in the module image. A fault is sticky, as on a GPU: every later wait answers it."""

from __future__ import annotations

import ctypes
import os

from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.driver import CudaError, ModuleLoadError, NoGPU
from tensorwasm.runtime.remote import HostBuffer

ILLEGAL_ADDRESS = 700  # CUDA_ERROR_ILLEGAL_ADDRESS


def _add_one(context: FakeContext, params) -> None:
    """u32s ``[ptr, ptr + 4n)`` plus one: ``(u64 ptr, u32 n)``."""
    ptr, n = params.values
    words = (ctypes.c_uint32 * n).from_address(ptr)
    for i in range(n):
        words[i] += 1


def _store_bits(context: FakeContext, params) -> None:
    """``(u64 ptr, value)``: the value's bytes, as the kernel got them, at ``ptr``."""
    ptr, value = params.slots
    ctypes.memmove(ptr.value, ctypes.addressof(value), ctypes.sizeof(value))


def _fault(context: FakeContext, params) -> None:
    context.fault = CudaError("cuStreamSynchronize", ILLEGAL_ADDRESS)


def _die(context: FakeContext, params) -> None:
    os._exit(3)


KERNELS = {"add_one": _add_one, "store_bits": _store_bits, "fault": _fault, "die": _die}


class FakeKernel:
    def __init__(self, context: FakeContext, name: str) -> None:
        self.context, self.name = context, name

    def launch(self, grid, block, params, shared_mem: int = 0, stream=None) -> None:
        if self.context.fault is None:
            KERNELS[self.name](self.context, params)


class FakeModule:
    def __init__(self, context: FakeContext, image: bytes) -> None:
        self.context = context
        self.entries = tuple(name for name in KERNELS if name.encode() in image)

    def function(self, name: str) -> FakeKernel:
        if name not in self.entries:
            raise CudaError("cuModuleGetFunction", 500, f"kernel {name!r}")  # CUDA_ERROR_NOT_FOUND
        return FakeKernel(self.context, name)

    def unload(self) -> None:
        pass


class FakeStream:
    handle = 0

    def __init__(self, context: FakeContext) -> None:
        self.context = context

    def copy_htod(self, dst: int, src: int, nbytes: int) -> None:
        if self.context.fault is None:
            ctypes.memmove(dst, src, nbytes)

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        if self.context.fault is None:
            ctypes.memmove(dst, src, nbytes)

    def synchronize(self) -> None:
        if self.context.fault is not None:
            raise self.context.fault


class FakeContext:
    def __init__(self, ordinal: int) -> None:
        self.info = DeviceInfo(ordinal, f"fake device (process {os.getpid()})", (9, 0), 13000, 1 << 30, 1)
        self.fault: CudaError | None = None
        self.registered: list[tuple[int, int]] = []

    def bind(self) -> None:
        pass

    def mem_alloc(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        return 1 << 30, 1 << 30

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        ctypes.memset(ptr, value, nbytes)

    def stream(self) -> FakeStream:
        return FakeStream(self)

    def host_register(self, base: int, nbytes: int) -> bool:
        self.registered.append((base, nbytes))
        return True

    def host_unregister(self, base: int) -> None:
        pass

    def load_module(self, image: bytes) -> FakeModule:
        if b"bad" in image:
            raise ModuleLoadError("cuModuleLoadDataEx", 218, "line 1: syntax error", "sm_90")  # INVALID_PTX
        return FakeModule(self, image)

    def link_cubin(self, image: bytes, assemble: bool = True) -> bytes:
        return image

    def load_cubin(self, cubin: bytes, entries) -> FakeModule:
        return FakeModule(self, cubin)


def make(ordinal: int) -> FakeContext:
    return FakeContext(ordinal)


def make_without_gpu(ordinal: int) -> FakeContext:
    raise NoGPU("no usable GPU: the driver reports zero devices")
