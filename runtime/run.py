"""``tensorwasm run``: a Wasm program on wasmtime, its parallel loops offloaded.

Command modules (``_start``) get WASI: arguments, standard streams and preopened
directories, so C programs built against wasi-libc run unchanged. ``--invoke`` calls one
export instead. The offload decisions and their costs are reported per loop.

Nothing here writes to stderr: what the command has to say (the host backend taken for
``auto``, a trap) is handed to the caller, whose ``say`` prints it (the CLI) or, by
default, is logged. The program's own output (its WASI streams, an invoked export's
results) goes to this process's stdout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import wasmtime

from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.rewrite import HOST_MODULE
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.support import config, logs
from tensorwasm.support.errors import TensorWasmError

log = logs.get_logger(__name__)


class RunError(TensorWasmError):
    """The program could not be run (not the program's own failure)."""


DEVICES = ("auto", "gpu", "cpu")


def pick_device(device: str) -> tuple[str, str | None]:
    """The device for ``device`` and, where ``auto`` takes the host backend, the line that
    says why (else None): ``auto`` is the GPU when one is usable, else the host backend. A
    GPU remembered on this machine (:mod:`runtime.known_gpu`) is taken without waiting for
    its context; should that context fail at the first launch, the loops stay on the CPU."""
    if device != "auto":
        return device, None
    from tensorwasm.runtime import known_gpu
    from tensorwasm.runtime.device_info import context_made

    if not context_made():
        if known_gpu.remembered() is not None:
            return "gpu", None  # the GPU this machine had last time: checked at the first launch
        absent = known_gpu.remembered_absence()
        if absent is not None:  # and nothing that could bring one has changed since
            return (
                "cpu",
                f"{absent} (last time; --device gpu asks again); loops run on the host backend (cpu)",
            )
    from tensorwasm.runtime import driver

    try:
        driver.Context.get()
    except driver.NoGPU as exc:
        known_gpu.remember_absence(str(exc), exc.lasting)
        return "cpu", f"{exc}; loops run on the host backend (cpu)"
    return "gpu", None


def prepare(wasm: bytes, device: str, **options) -> tuple[OffloadModule, str | None]:
    """The module prepared for offload on the device :func:`pick_device` names, with the
    line that says why ``auto`` took the host backend (else None). Where ``auto`` named a
    GPU whose context cannot be made while the module is prepared, the module is prepared
    for the host backend instead, and the line says so (a remembered GPU's context is made
    only at the first launch: where that fails, wasmtime runs the loops)."""
    if device not in DEVICES:
        raise TensorWasmError(f"device must be auto, gpu or cpu, not {device!r}")
    config.device_memory_limit()  # a malformed limit is refused whichever device runs the loops
    picked, note = pick_device(device)
    if device != "auto":
        return OffloadModule(wasm, device=picked, **options), note
    try:
        return OffloadModule(wasm, device=picked, **options), note
    except TensorWasmError as exc:
        from tensorwasm.runtime import driver  # (loaded where it raised)

        if not isinstance(exc, (driver.NoGPU, driver.CudaError)):
            raise
        return OffloadModule(wasm, device="cpu", **options), f"{exc}; loops run on the host backend (cpu)"


def run(
    wasm: bytes,
    argv: list[str],
    *,
    invoke: str | None = None,
    invoke_args: list[str] | None = None,
    offload: str = "auto",
    device: str = "auto",
    dirs: list[str] | None = None,
    env: list[str] | None = None,
    relaxed_float: bool = False,
    say: Callable[[str], None] | None = None,
    ready: Callable[[], None] | None = None,
) -> tuple[int, OffloadModule, dict]:
    """Run the program; returns (exit status, the offload module, timings). ``say`` gets
    each line the run has to tell its user (``auto`` took the host backend; the program
    trapped), when it happens; without it they are logged as warnings. ``ready`` (where
    given) is called once the program is instantiated, before it starts."""
    say = say or log.warning
    started = time.perf_counter()
    prepared, note = prepare(
        wasm, device, mode="off" if offload == "off" else offload,
        options=AnalysisOptions(relaxed_float=relaxed_float), pin=True,
    )  # fmt: skip
    if note is not None:
        say(note)
    prepared.load_host_kernels_early()  # (on a compile worker, beside wasmtime's compile and the program's start)
    compiled = time.perf_counter()
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = argv
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.inherit_stdin()
    variables = []
    for spec in env or []:
        name, eq, value = spec.partition("=")
        if not eq or not name:
            raise RunError(f"--env takes NAME=VALUE, not {spec!r}")
        variables.append((name, value))
    wasi.env = variables
    for spec in dirs or []:
        host, _, guest = spec.partition("::")
        if not os.path.isdir(host):
            raise RunError(f"--dir {host}: no such directory")
        try:
            wasi.preopen_dir(host, guest or host)
        except wasmtime.WasmtimeError as exc:
            raise RunError(f"--dir {host}: {_cause(exc)}") from None
    store.set_wasi(wasi)
    prepared.define(linker, store)
    try:
        module = prepared.compiled(engine)
        if {imp.module for imp in module.imports} - {HOST_MODULE, "wasi_snapshot_preview1"}:
            from tensorwasm.runtime.wasi_cuda import define_if_imported  # a guest that ships its own PTX

            define_if_imported(linker, store, module)
        linker.define_unknown_imports_as_traps(module)
        instance = linker.instantiate(store, module)
        prepared.bind(store, instance.exports(store))
    except wasmtime.Trap as exc:  # a start function or an active segment trapped
        say(f"the program trapped while it was instantiated: {_cause(exc)}")
        prepared.close()
        return 134, prepared, {"compile_seconds": compiled - started, "run_seconds": 0.0}
    except wasmtime.WasmtimeError as exc:
        prepared.close()
        raise RunError(f"cannot instantiate: {str(exc).strip().splitlines()[0]}") from None
    if ready is not None:
        ready()
    status = 0
    try:
        if invoke is not None:
            func = instance.exports(store).get(invoke)
            if not isinstance(func, wasmtime.Func):
                raise RunError(f"no exported function {invoke!r}")
            params = func.type(store).params
            if len(invoke_args or []) != len(params):
                raise RunError(f"{invoke} takes {len(params)} argument(s), got {len(invoke_args or [])}")
            values = [_parse_arg(text, ty) for text, ty in zip(invoke_args or [], params, strict=True)]
            result = func(store, *values)
            if result is not None:
                print(" ".join(map(str, result if isinstance(result, (list, tuple)) else [result])))
        else:
            start = instance.exports(store).get("_start")
            if not isinstance(start, wasmtime.Func):
                raise RunError("the module has no _start: name a function with --invoke")
            start(store)
    except wasmtime.ExitTrap as exc:
        status = exc.code
    except wasmtime.Trap as exc:
        say(f"the program trapped: {_cause(exc)}")
        status = 134
    except wasmtime.WasmtimeError as exc:  # e.g. WASI asked for an export the module lacks
        raise RunError(f"the program could not go on: {_cause(exc)}") from None
    finally:
        prepared.close()
    finished = time.perf_counter()
    prepared.remember_host_kernels()
    timings = {"compile_seconds": compiled - started, "run_seconds": finished - compiled}
    return status, prepared, timings


def _cause(exc: Exception) -> str:
    """The last line of wasmtime's message: the cause, under its backtrace."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _parse_arg(text: str, ty: wasmtime.ValType) -> int | float:
    """A command-line argument as a value of ``ty``: an integer must fit its width, signed
    or unsigned (wasmtime-py would wrap it silently)."""
    kind = str(ty)
    try:
        value = float(text) if kind in ("f32", "f64") else int(text, 0)
    except ValueError:
        raise RunError(f"cannot read {text!r} as {kind}") from None
    if kind in ("i32", "i64"):
        bits = int(kind[1:])
        if not -(1 << (bits - 1)) <= value < 1 << bits:
            raise RunError(f"{text} does not fit an {kind}")
        if value >= 1 << (bits - 1):  # an unsigned spelling: the same bits, as wasmtime-py wants them
            value -= 1 << bits
    return value


def report(prepared: OffloadModule, timings: dict, fmt: str) -> str:
    import json

    from tensorwasm.runtime.api import offload_report
    from tensorwasm.support.records import asdict

    found = offload_report(prepared)
    rows = [asdict(row) for row in found.loops]
    regions = found.regions
    if fmt == "json":
        return json.dumps({"device": prepared.device, **timings, "loops": rows, "regions": regions,
                           "unsupported": found.unsupported})  # fmt: skip
    lines = [f"tensorwasm: offload report (device {prepared.device}; compile {timings['compile_seconds'] * 1e3:.0f} ms, "
             f"run {timings['run_seconds'] * 1e3:.0f} ms)"]  # fmt: skip
    if found.unsupported is not None:
        lines.append(f"  nothing offloaded: the module {found.unsupported}; it runs on wasmtime as it is")
    for row in rows:
        where = f"{row['func']} +0x{row['offset']:x}"
        if row["device"] is None:
            if row["verdict"] == "offload":
                lines.append(f"  {where}: parallel, runs inside an offloaded outer loop")
            else:
                lines.append(f"  {where}: stays on the CPU: {row['reason']}")
            continue
        if not row["arrivals"]:
            inside = row["inside"]
            lines.append(
                f"  {where}: parallel, inside the offloaded loop at +0x{inside:x}: launches on its own only "
                "where that one declines (not reached)" if inside is not None else f"  {where}: parallel, never reached"
            )  # fmt: skip
            continue
        declined = ", ".join(f"{n}x {why}" for why, n in row["declined"].items()) or "none"
        lines.append(
            f"  {where}: ran {row['offloaded']}/{row['arrivals']} times on {row['device']}"
            + (f" ({row['on_host']} of them on the host's threads before it started)" if row.get("on_host") else "")
            + ", "
            f"{row['iterations']} iterations, {row['bytes_in'] + row['bytes_out']} bytes moved, "
            f"kernel {row['kernel_seconds'] * 1e3:.2f} ms, transfers {row['transfer_seconds'] * 1e3:.2f} ms; "
            f"declined: {declined}"
            + (f"; in the device-resident region at +0x{regions[row['region']]['offset']:x}"
               if row["region"] is not None else "")
        )  # fmt: skip
    for r in regions:
        kept = (
            "its data stays on the device between launches" if prepared.device == "gpu" else "runs in place"
        )
        lines.append(
            f"  region {r['func']} +0x{r['offset']:x}: a loop around {r['loops']} offloaded loop(s), "
            f"{kept}; left {r['exits']} times, {r['bytes_out']} bytes brought back in "
            f"{r['transfer_seconds'] * 1e3:.2f} ms"
        )
    return "\n".join(lines)
