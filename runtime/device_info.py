"""What describes a GPU, apart from the driver layer (:mod:`runtime.driver`), whose import
(with the CUDA bindings behind it) a warm start on a remembered GPU does without
(:mod:`runtime.known_gpu`)."""

from __future__ import annotations

import sys

from tensorwasm.support.records import record


@record(frozen=True)
class DeviceInfo:
    """What the compiler and reports need to know about one GPU."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    driver_version: int
    total_memory: int
    multiprocessor_count: int

    @property
    def arch(self) -> str:
        """The PTX target name, e.g. ``sm_90``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def context_made(ordinal: int = 0) -> bool:
    """Whether this process made device ``ordinal``'s CUDA context (``Context.made``),
    answered without importing the driver layer: only it makes one."""
    # (a thread may be importing it: then no context is made yet)
    context = getattr(sys.modules.get("tensorwasm.runtime.driver"), "Context", None)
    return context is not None and context.made(ordinal) is not None
