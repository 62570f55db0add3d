"""The Python entry point: wasmtime-py with one call changed.

    instance = wasmtime.Instance(store, wasmtime.Module(engine, wasm), imports)
becomes
    instance = tensorwasm.instantiate(store, wasm, imports)

and the instance's parallel loops run on the GPU (or the host backend) where it pays.
``runtime.report(instance)`` says, per loop, where it ran, how often, what it moved and
cost, and why it stayed on the CPU where it did.

Nothing here writes to stderr. Where ``device="auto"`` finds no usable GPU, the loops run
on the host backend: that is said once per process as a :class:`HostBackendWarning`, and
for every instance in the log (``tensorwasm.runtime.api``, at INFO).
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Sequence

import wasmtime

from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.rewrite import HOST_MODULE
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.support import logs, records
from tensorwasm.support.errors import TensorWasmError

log = logs.get_logger(__name__)

# The offload module behind each instance made here (it lives as long as its instance).
_PREPARED: weakref.WeakKeyDictionary[wasmtime.Instance, OffloadModule] = weakref.WeakKeyDictionary()
# Each instance's store, kept while the instance is: its report reads the counts the
# Wasm-side filters keep in the instance's globals.
_STORES: weakref.WeakKeyDictionary[wasmtime.Instance, wasmtime.Store] = weakref.WeakKeyDictionary()
# Whether this process has warned that "auto" took the host backend (it does so once).
_warned_host_backend = False


class HostBackendWarning(RuntimeWarning):
    """``device="auto"`` found no usable GPU: the instance's loops run on the host backend."""


def instantiate(
    store: wasmtime.Store,
    wasm: bytes,
    imports: Sequence[wasmtime.Func | wasmtime.Table | wasmtime.Memory | wasmtime.Global] = (),
    *,
    linker: wasmtime.Linker | None = None,
    device: str = "auto",
    offload: str = "auto",
    relaxed_float: bool = False,
    device_memory_limit: int | None = None,
    pin: bool = True,
) -> wasmtime.Instance:
    """Instantiate the module ``wasm`` (its bytes, which are rewritten) in ``store`` with its
    own ``imports`` in order, as ``wasmtime.Instance`` takes them, or with what ``linker``
    defines (WASI, say), as ``linker.instantiate`` would; the linker itself is left as it is.

    ``device``: "gpu", "cpu" (the host backend) or "auto" (the GPU where one is usable);
    ``offload``: "auto" (where the estimate says a launch pays), "always" or "off".
    ``pin``: on the GPU, page-lock the instance's linear memory at its first launch, so the
    copies run at page-locked speed (~55 GB/s, not 18 in and 4 out); it is unlocked, and
    device memory given back, when the instance goes, and the store is kept until then (its
    memory must not be unmapped while the driver pins it). Closing the store by hand
    (``store.close()``) while the instance lives is then not allowed; pass ``pin=False``
    to keep linear memory pageable.
    """
    from tensorwasm.runtime.run import prepare

    if offload not in ("auto", "always", "off"):
        raise TensorWasmError(f"offload must be auto, always or off, not {offload!r}")
    if linker is not None and imports:
        raise TensorWasmError("give the imports or a linker, not both")
    prepared, note = prepare(
        bytes(wasm), device, mode=offload,
        options=AnalysisOptions(relaxed_float=relaxed_float), device_memory_limit=device_memory_limit, pin=pin,
    )  # fmt: skip
    if note is not None:
        _tell_host_backend(note)
    module = prepared.compiled(store.engine)
    ours = prepared.host_functions(store)
    theirs = iter(imports)
    externs = []
    for item in module.imports:
        if item.module == HOST_MODULE:
            externs.append(ours[item.name])
            continue
        if linker is not None:
            try:
                externs.append(linker.get(store, item.module, item.name or ""))
            except wasmtime.WasmtimeError:
                raise TensorWasmError(f"the linker defines no import {item.module}.{item.name}") from None
            continue
        extern = next(theirs, None)
        if extern is None:
            raise TensorWasmError(f"missing import {item.module}.{item.name}: the module takes "
                                  f"{len(module.imports) - len(ours)} imports")  # fmt: skip
        externs.append(extern)
    if next(theirs, None) is not None:
        raise TensorWasmError(f"too many imports: the module takes {len(module.imports) - len(ours)}")
    instance = wasmtime.Instance(store, module, externs)
    prepared.bind(store, instance.exports(store))
    _PREPARED[instance] = prepared
    _STORES[instance] = store
    weakref.finalize(instance, _close, prepared, store)
    return instance


def _close(prepared: OffloadModule, store: wasmtime.Store) -> None:
    """Unpin linear memory and give back device memory when the instance goes: the finalizer
    holds ``store`` until now, so the memory the driver pins is still mapped here."""
    prepared.close()
    del store  # (held only to outlive the pin)


def _tell_host_backend(note: str) -> None:
    """Say that ``auto`` took the host backend: in the log each time, as a warning once per
    process (an application that makes many instances is told once, not per instance)."""
    global _warned_host_backend
    log.info("%s", note)
    if not _warned_host_backend:
        _warned_host_backend = True
        warnings.warn(note, HostBackendWarning, stacklevel=3)  # (the caller of instantiate)


@records.record
class LoopRecord:
    """One loop of the module: where it is, the detector's verdict, and (for an offloaded
    loop) what its arrivals did."""

    func: str
    offset: int
    depth: int
    verdict: str  # "offload" or "reject"
    reason: str
    device: str | None = None  # where its launches ran; None: not offloaded on its own
    arrivals: int = 0
    offloaded: int = 0
    declined: dict[str, int] | None = None  # reason -> arrivals
    iterations: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    kernel_seconds: float = 0.0
    transfer_seconds: float = 0.0
    threads: int = 1  # host backend: the most threads one launch used
    pinned: bool = False  # GPU: copies from page-locked linear memory
    region: int | None = None  # the device-resident region it is in
    inside: int | None = None  # the offset of the offloaded loop around it, if any
    on_host: int = 0  # of the offloaded: on the host's threads before the GPU started


@records.record
class OffloadReport:
    """Per loop of the module (its loops in libc included), in the order of the code; a
    loop in a function that uses a proposal TensorWasm does not compile is declined with
    that reason. ``unsupported`` says why no loop is offloaded where the module itself uses
    such a proposal (a 64-bit memory, say): it then runs on wasmtime as it is."""

    device: str
    loops: list[LoopRecord]
    regions: list[dict]
    unsupported: str | None = None

    def json(self) -> str:
        return json.dumps(self.asdict())

    def asdict(self) -> dict:
        """The report as plain dicts and lists (what :meth:`json` writes)."""
        return {**records.asdict(self), "loops": [records.asdict(row) for row in self.loops]}


def report(instance: wasmtime.Instance) -> OffloadReport:
    """What the loops of an instance made by :func:`instantiate` did so far."""
    prepared = _PREPARED.get(instance)
    if prepared is None:
        raise TensorWasmError("the instance was not made by tensorwasm.instantiate")
    return offload_report(prepared)


def offload_report(prepared: OffloadModule) -> OffloadReport:
    prepared.collect_skipped()
    around = _enclosing(prepared)
    loops = []
    for func, offset, depth, verdict, reason, k in prepared.report_rows():
        if k is None:
            loops.append(LoopRecord(func, offset, depth, verdict, reason))
            continue
        chosen = prepared.loops[k]
        stats = chosen.stats
        row = LoopRecord(  # every field in order: the record's quickest making
            func, offset, depth, verdict, reason, stats.device, stats.arrivals,
            stats.offloaded, dict(stats.declined), stats.iterations, stats.bytes_in, stats.bytes_out,
            stats.kernel_seconds, stats.transfer_seconds, stats.threads, stats.pinned, stats.region,
            around.get(id(chosen)), stats.on_host,
        )  # fmt: skip
        loops.append(row)
    regions = [records.asdict(r) for r in prepared.region_stats]
    return OffloadReport(prepared.device, loops, regions, prepared.unsupported)


def _enclosing(prepared: OffloadModule) -> dict[int, int]:
    """For each offloaded loop inside another, by ``id``: the offset of the innermost one
    around it (its host call is reached only when that one declines)."""
    around = {}
    for lp in prepared.loops:
        ins = lp.insertion
        outer = [
            o for o in prepared.loops
            if o.insertion.func_index == ins.func_index and o.insertion.start < ins.start and ins.end < o.insertion.end
        ]  # fmt: skip
        if outer:
            around[id(lp)] = max(outer, key=lambda o: o.insertion.start).stats.offset
    return around
