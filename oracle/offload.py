"""The oracle's "offload" backend: a Wasm module run on wasmtime with its loops offloaded."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from tensorwasm.compiler.rewrite import HOST_MODULE, NEVER_SKIP
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.support.digest import sha256

if TYPE_CHECKING:
    from tensorwasm.runtime.device import Device


# Thresholds the fuzzer's offload instances give their filters: mostly never skip, else
# skip only a loop with nowhere to go, a little, some, nearly all.
FILTER_DRAWS = (NEVER_SKIP, NEVER_SKIP, NEVER_SKIP, NEVER_SKIP, 0, 3, 16, 1 << 20)
# Shares of the arrivals whose guards passed that the fuzzer's offload instances decline
# (``declines``), drawn per module: mostly none, else some, most.
DECLINE_DRAWS = (0.0, 0.0, 0.25, 0.75)
DRAWN = "declined by the oracle's draw"


class DrawnDecisions:
    """A loop's cost model (:class:`runtime.profit.Estimate`) replaced by a draw: an arrival
    whose guards passed launches or declines by it, as ``auto`` mode's model would decide, so
    that wasmtime runs some loops of a device-resident region between its launches (what
    :meth:`runtime.mirror.DeviceMirror.flush_part` keeps exact)."""

    def __init__(self, draw: random.Random, share: float) -> None:
        self.draw, self.share = draw, share

    def decide(self, *_args, **_kwargs) -> tuple[bool, str, float, float]:
        go = self.draw.random() >= self.share
        return go, "" if go else DRAWN, 0.0, 0.0

    def record(self, *_args) -> None:
        pass


class OffloadInstance:
    """An instance of the rewritten module on wasmtime, called with exact bit patterns, whose
    loops are offloaded: the differential oracle's "offload" backend. It answers the same
    calls as the executors (``call``, ``memory``, ``globals``)."""

    def __init__(
        self,
        wasm: bytes,
        device: str | Device = "cpu",
        filters: bool = False,
        pin: bool = False,
        mode: str = "always",
        declines: bool = False,
    ):
        """``filters``: give the Wasm-side filters thresholds drawn per module (a fixed draw,
        so a shrunk case keeps its own), as the fuzzer does: arrivals kept from the host
        must run as they would there. Otherwise every arrival asks the host. ``pin``: on the
        GPU, page-lock linear memory as ``tensorwasm run`` does (launches then replay from
        recorded graphs); :meth:`close` must then be called before the instance goes.
        ``device``: a name, or a :class:`~runtime.device.Device` (the simulated device).
        ``mode``: the offload mode (``always``, as the oracle runs it; ``auto`` for tests of
        what the cost model and the gates decide). ``declines``: ``auto`` mode with the cost
        model replaced by a draw per module (:class:`DrawnDecisions`; the device counted as
        started, each kernel compiled at its first launch), as the fuzzer runs it."""
        from tensorwasm.runtime.instance import initial_state
        from tensorwasm.runtime.reference import ReferenceInstance

        # Replays go native at once: the oracle compares them too.
        self.offload = OffloadModule(
            wasm, device=device, mode="auto" if declines else mode, pin=pin, native_after=1
        )
        if declines:
            self._draw_declines()
        self.wasm = self.offload.wasm
        self.state = initial_state(self.wasm)

        def host_funcs(store):
            return {(HOST_MODULE, name): f for name, f in self.offload.host_functions(store).items()}

        self._instance = ReferenceInstance(self.offload.rewritten, host_funcs)
        draws = [NEVER_SKIP] * len(self.offload.loops)  # every arrival asks, ``declines`` or not
        if filters:
            draw = random.Random(sha256(self.offload.rewritten).digest())
            draws = [draw.choice(FILTER_DRAWS) for _ in self.offload.loops]
        self.offload.bind(self._instance._store, self._instance._exports, draws)

    def _draw_declines(self) -> None:
        offload = self.offload
        draw = random.Random(sha256(offload.rewritten + b"declines").digest())
        share = draw.choice(DECLINE_DRAWS)
        for lp in offload.loops:
            lp.estimate = DrawnDecisions(draw, share)
        planner = offload.planner
        planner._started = lambda gain, lp=None: None  # (no start-up rule: the draw alone decides)
        planner.while_starting = None
        offload._kernels.background = lambda: False  # (no arrival declines while one compiles)

    def call(self, export: str, args):
        return self._instance.call(export, args)

    def close(self) -> None:
        """Give back device memory and unpin linear memory (the oracle calls it per module)."""
        self.offload.close()

    def memory(self) -> bytes | None:
        names = self.wasm.export_names("memory", 0)
        return self._instance.memory(names[0]) if names else None

    def globals(self) -> list[int]:
        values = [0] * len(self.wasm.global_types())
        exported = self._instance.globals()
        for export in self.wasm.exports:
            if export.kind == "global" and export.name in exported:
                values[export.index] = exported[export.name][1]
        return values

    @property
    def offloaded(self) -> int:
        return sum(lp.stats.offloaded for lp in self.offload.loops)
