"""Where an offloaded module's launches run: the :class:`Device` protocol.

An :class:`~runtime.offload.OffloadModule` is given one device at construction and keeps
it: the CUDA device (:class:`runtime.cuda_device.CudaDevice`), the same in a GPU process of
its own (:class:`runtime.cuda_device.GpuProcessDevice`), the host backend
(:class:`runtime.host_device.HostDevice`), or the oracle's simulated device
(``oracle.simulated.SimulatedDevice``). Every device says which code it runs (PTX or the
host's object code), loads it, and makes the execution side that runs a planned launch
(:class:`runtime.planning.LaunchRunner`). Devices with memory of their own (``kind``
"gpu") also allocate it, bind their context, reset after a sticky fault and give the entry
points native replays call; copies, launches, recorded launches and waits go through the
:class:`DeviceMemory` they allocate. A device serves one module (it keeps that module's
state on it: its loaded kernels, and after a fault the GPU process it moved to); modules
share the CUDA context itself.
"""

from __future__ import annotations

from typing import Any, Protocol


class Device(Protocol):
    """What an offloaded module asks of the device its launches run on."""

    kind: str  # "gpu": launches copy to device memory and back; "cpu": in linear memory itself
    code: str  # the code the module compiles for it: "gpu" (PTX) or "cpu" (host object code)
    label: str  # how the report names it
    pin: bool  # whether it page-locks linear memory whatever the module asks

    def target(self) -> Any:
        """The compilation target of its code."""

    def load_kernels(self, unit: Any) -> dict[str, Any]:
        """One kernel's code (a :class:`runtime.loop_kernels.KernelUnit`: its loops, and its
        PTX or host object code) loaded on this device: its loops' entries by name."""

    def runner(self, prepared: Any) -> Any:
        """The execution side of the prepared module's launches on this device (a
        :class:`runtime.planning.LaunchRunner`)."""

    def close(self) -> None:
        """End what the device started for its module (a GPU process)."""


class DeviceMemory(Protocol):
    """Device memory of one module and the work queued on it (:class:`runtime.mirror.DeviceMirror`):
    buffers, copies in and out, launches, recorded launches replayed, waits."""

    stale: bool
    holds_results: bool

    def ensure(self, size: int, scratch_slots: int, staged_bytes: int = 0) -> None: ...
    def launch(self, key, base, copies, upload, kernel, grid, block, params, back, staged, at): ...
    def synchronize(self) -> None: ...
    def flush(self, base: int) -> int: ...
    def flush_part(self, base: int, touched, written) -> int: ...
    def forget(self) -> None: ...
    def release(self) -> None: ...
    def abandon(self) -> None: ...


class MemoryDevice(Device, Protocol):
    """A device with memory of its own (``kind`` "gpu"), reached through a context."""

    context: Any  # the driver's context, or a GPU process's stand-in for it

    def allocate(self, limit: int | None) -> DeviceMemory:
        """New device memory for the module's launches, capped at ``limit`` bytes."""

    def bind(self) -> None:
        """Make its context current on the calling thread."""

    def native_calls(self) -> tuple[int, int, int, int] | None:
        """The driver's ``cuCtxSetCurrent``, ``cuGraphLaunch``, ``cuStreamSynchronize`` and the
        context handle, for native replays; None where none can replay (a GPU process)."""

    def reset(self) -> None:
        """After a sticky fault: reset the context (raises where no context can be made)."""

    def renew(self, fault: Any = None) -> None:
        """After a reset: where the driver refused it, go on in a GPU process of its own."""

    def watch(self, listener: Any) -> None:
        """Tell ``listener.context_reset(context)`` when its context is reset, by anyone."""

    def resident_blocks(self) -> int:
        """Blocks a launch may have that are all resident at once, whatever the kernel."""

    def wave_blocks(self, kernel: Any, threads: int) -> int | None:
        """Blocks of ``kernel``, ``threads`` threads each, resident at once (one wave); None
        where it cannot say."""

    def code_ready(self, ptx: bytes) -> bool:
        """Where its code is PTX: whether a kernel's first load finds its machine code made."""

    def assemble(self, ptx: bytes) -> bool:
        """Where its code is PTX: make a kernel's machine code now, without a driver call
        (a compile worker asks), so that its first launch only loads it; whether it did."""
