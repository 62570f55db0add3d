"""The ``tensorwasm`` command line.

Every subcommand turns the project's own errors into one line on stderr and exit status
2; anything else escaping is a bug and keeps its traceback. The command line owns what is
printed: the library below it returns what it has to say, or logs it.

A command defined above the runtime (``fuzz``, the oracle's) is named here by its module
only, imported when its parser is built (:data:`SUBCOMMANDS`): the runtime imports no
layer above it, and a ``run`` pays nothing for the others.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from tensorwasm.support import config, logs
from tensorwasm.support.errors import TensorWasmError

if TYPE_CHECKING:
    import argparse
    import threading

try:  # the signal module's functions, without its enums (~0.6 ms of a run's start)
    from _signal import SIG_DFL, SIGINT
    from _signal import signal as set_signal
except ImportError:  # another Python
    from signal import SIG_DFL, SIGINT
    from signal import signal as set_signal

log = logs.get_logger("tensorwasm")


def _select_functions(module, key: str | None) -> set[int] | None:
    """Function indices named by ``--func`` (an index, an export or a debug name)."""
    if key is None:
        return None
    if key.isdigit():
        index = int(key)
        if index >= module.num_funcs:
            raise TensorWasmError(f"no function {index}: the module has {module.num_funcs}")
        return {index}
    for exp in module.exports:
        if exp.kind == "func" and exp.name == key:
            return {exp.index}
    for index, name in module.func_names.items():
        if name == key:
            return {index}
    raise TensorWasmError(f"no function named {key!r} (by export or debug name)")


def cmd_inspect(args: argparse.Namespace) -> int:
    from tensorwasm.compiler import pipeline
    from tensorwasm.compiler.frontend import read_wasm
    from tensorwasm.support.records import replace

    request = pipeline.Request(read_wasm(args.module))
    state = pipeline.run(request, "wasm")
    only = _select_functions(state.wasm.module, args.func)
    request = replace(request, **_inspect_choices(args, only))
    state = pipeline.run(request, args.stage, state=state)
    view = pipeline.View(frozenset(only) if only is not None else None, args.format)
    sys.stdout.write(pipeline.STAGES[args.stage].show(getattr(state, args.stage), view))
    if state.kernels is not None:
        for index, reason in sorted(state.kernels.skipped.items()):
            print(f"tensorwasm: left out function {index}: {reason}", file=sys.stderr)
    return 0


def _inspect_choices(args: argparse.Namespace, only: set[int] | None) -> dict:
    """The pipeline request's fields for ``inspect --stage``: ``dialect`` translates the
    functions asked for alone, ``loops`` analyses the whole module, ``llvm`` and ``ptx``
    compile the functions asked for whole (``llvm`` for the host unless told)."""
    from tensorwasm.compiler import pipeline
    from tensorwasm.compiler.analysis.plan import AnalysisOptions
    from tensorwasm.compiler.target import parse_target

    functions = tuple(sorted(only)) if only is not None else None
    if args.stage == "dialect":
        return {"functions": functions, "translate": pipeline.SELECTED}
    if args.stage == "loops":
        return {"entries": pipeline.LOOPS, "options": AnalysisOptions(relaxed_float=args.relaxed_float)}
    if args.stage not in ("llvm", "ptx"):
        return {}
    target = parse_target(args.target or ("host" if args.stage == "llvm" else _default_arch()))
    if args.stage == "ptx" and not target.is_gpu:
        raise TensorWasmError("--stage ptx needs an NVPTX target (sm_75, sm_80 or sm_90)")
    return {"functions": functions, "target": target}


def _default_arch() -> str:
    """The GPU's architecture when there is one, else sm_90."""
    from tensorwasm.compiler.target import arch_for_capability
    from tensorwasm.runtime import driver

    found = driver.devices()
    return arch_for_capability(found[0].compute_capability) if found else "sm_90"


def cmd_devices(args: argparse.Namespace) -> int:
    from tensorwasm.compiler.target import driver_ptx_limit, nvptx_for_device
    from tensorwasm.runtime import driver

    reason = None
    try:
        found = driver.devices()
    except TensorWasmError as exc:
        found, reason = [], str(exc)
    if not found:
        if reason is None:
            try:
                driver.Context.get()
            except driver.NoGPU as exc:
                reason = str(exc)
        print(f"no GPU: {reason or 'no CUDA device found'}; the host backend (cpu) is available")
        return 0
    for info in found:
        major, minor = info.compute_capability
        version = f"{info.driver_version // 1000}.{(info.driver_version % 1000) // 10}"
        limit = ".".join(map(str, driver_ptx_limit(info.driver_version)))
        try:
            target = nvptx_for_device(info.compute_capability, info.driver_version)
            chosen = f"{target.arch} (PTX ISA {target.ptx_isa})"
        except TensorWasmError as exc:
            chosen = f"unsupported: {exc}"
        print(
            f"GPU {info.ordinal}: {info.name}, compute capability {major}.{minor}, "
            f"{info.total_memory / 2**30:.1f} GiB, {info.multiprocessor_count} SMs; "
            f"target {chosen}; CUDA driver {version} accepts PTX ISA up to {limit}"
        )
    return 0


def _open_backend(name: str, wasm: bytes, target: str | None = None):
    """The executor for ``--backend``; ``auto`` is the GPU when there is one, else the host."""
    from tensorwasm.runtime import driver
    from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
    from tensorwasm.runtime.reference import ReferenceInstance

    if name == "wasmtime":
        return ReferenceInstance(wasm)
    if name == "cpu":
        return HostExecutor(wasm)
    if name == "auto":
        try:
            driver.Context.get()
        except driver.NoGPU as exc:
            print(f"tensorwasm: {exc}; running on the host backend (cpu)", file=sys.stderr)
            return HostExecutor(wasm)
    from tensorwasm.compiler.target import parse_target

    return GPUExecutor(wasm, target=parse_target(target) if target else None)


def cmd_invoke(args: argparse.Namespace) -> int:
    from tensorwasm.compiler.frontend import read_wasm
    from tensorwasm.runtime.values import CallResult, ValueFormatError, format_result, parse_call_line

    wasm = read_wasm(args.module)
    executor = _open_backend(args.backend, wasm, args.target)
    stream = sys.stdin if args.calls == "-" else _open_text(args.calls)
    status = 0
    with stream:
        try:
            for line in stream:
                if not line.strip():
                    continue
                try:
                    name, values = parse_call_line(line)
                except ValueFormatError as exc:
                    print(format_result(CallResult(error=str(exc))), flush=True)
                    status = 1
                    continue
                result = executor.call(name, values)
                if result.error:
                    status = 1
                print(format_result(result), flush=True)
        except UnicodeDecodeError as exc:
            raise TensorWasmError(
                f"--calls {args.calls}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at {exc.start} of a "
                "read): the calls are JSON lines"
            ) from None
    return status


def _open_text(path: str):
    try:
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise TensorWasmError(f"cannot read {path}: {exc.strerror}") from None


def _device_target():
    """The GPU's NVPTX target, or None where there is no GPU (or no driver)."""
    from tensorwasm.compiler.target import nvptx_for_device
    from tensorwasm.runtime import driver

    found = driver.devices() if driver.driver_available() else []
    if not found:
        return None
    return nvptx_for_device(found[0].compute_capability, found[0].driver_version)


def cmd_compile(args: argparse.Namespace) -> int:
    from tensorwasm.compiler.aot import compile_to_directory
    from tensorwasm.runtime.cache import default_cache, make_key

    device = _device_target() if args.target is None else None
    manifest = compile_to_directory(
        args.module, Path(args.output), args.target, device, default_cache(), make_key
    )
    kernels = len(manifest["kernels"])
    skipped = len(manifest["skipped"])
    targets = ", ".join(manifest["targets"])
    print(f"wrote {kernels} kernels for {targets} to {args.output} ({skipped} functions left out)")
    for item in manifest["skipped"]:
        print(f"  left out {item['function']}: {item['reason']}")
    return 0


def _start_cuda() -> None:
    """Create the CUDA context (~0.2 s on an H100) while the main thread imports the runtime;
    its own request then finds it made, or fails there with the reason."""
    from tensorwasm.runtime.gpu_start import make_context

    make_context(launch_expected=True)


# The thread making the CUDA context that the last run began at its start (see entry).
_cuda_start: threading.Thread | None = None


def _may_launch(raw: bytes, device: str) -> bool:
    """Whether a run of the module ``raw`` (its file's bytes) makes the CUDA context on a
    thread while it starts: not where the GPU is remembered, so that preparing the module
    needs no context, and the module's last run here launched nothing; nor, with ``auto``,
    where the driver found no GPU last time and nothing changed since (see
    :mod:`runtime.known_gpu`)."""
    from tensorwasm.runtime import known_gpu

    if known_gpu.remembered() is None:
        return device != "auto" or known_gpu.remembered_absence() is None
    return known_gpu.launched_last_time(raw) is not False


def cmd_run(args: argparse.Namespace) -> int:
    # Ctrl-C ends the program at once, as it ends a native one: Python's handler would wait
    # for wasmtime or a host kernel to come back (never, for a loop that does not end).
    # Nothing is left half-written: cache entries and remembered devices are renamed into
    # place, and a GPU process of the run's own ends when its socket closes.
    set_signal(SIGINT, SIG_DFL)
    # The start makes thousands of objects that live to the end (modules, the cached
    # preparation): collecting them is wasted work until the program runs (~1.5 ms).
    if not gc.isenabled():  # (the caller's choice: kept)
        return _run(args, None)
    gc.disable()
    try:
        return _run(args, gc.enable)
    finally:
        gc.enable()


def _run(args: argparse.Namespace, ready: Callable[[], None] | None) -> int:
    global _cuda_start
    from tensorwasm.compiler.frontend import read_module_file

    raw = read_module_file(args.module)  # read once: the module may come through a pipe
    if args.device != "cpu" and args.offload != "off" and _may_launch(raw, args.device):
        from tensorwasm.runtime.gpu_start import STARTER

        _cuda_start = STARTER.begin(_start_cuda)  # (a launch's start-up rule counts its progress)
    from tensorwasm.compiler.frontend import wasm_of
    from tensorwasm.runtime.run import report, run

    wasm = wasm_of(raw, args.module)
    argv = [args.module, *args.args]
    name, *values = args.invoke or [None]
    status, prepared, timings = run(
        wasm, argv, invoke=name, invoke_args=values, offload=args.offload,
        device=args.device, dirs=args.dir, env=args.env, relaxed_float=args.relaxed_float, say=_say,
        ready=ready,
    )  # fmt: skip
    if prepared.device == "gpu" and args.offload != "off":
        from tensorwasm.runtime import known_gpu

        known_gpu.remember_launches(raw, prepared.launched_on_device() or prepared.planner.start_would_pay())
    if args.report:
        print(report(prepared, timings, args.report), file=sys.stderr)
    return status


def _say(line: str) -> None:
    """A line the library has for the user, on stderr."""
    print(f"tensorwasm: {line}", file=sys.stderr)


def cmd_cache(args: argparse.Namespace) -> int:
    from tensorwasm.runtime.cache import default_cache

    cache = default_cache()
    if args.action == "clear":
        cleared = cache.clear()
        if not cleared.found:
            print(f"nothing to remove: {cache.directory} does not exist")
        elif not cleared.removed and cleared.left:
            print(f"{cache.directory} is not a TensorWasm cache: nothing removed")
        elif not cleared.removed:
            print(f"nothing to remove in {cache.directory}")
        else:
            files = sum(files for files, _ in cleared.removed.values())
            kinds = ", ".join(f"{kind} {files}" for kind, (files, _) in sorted(cleared.removed.items()))
            print(f"removed {files} files ({cleared.bytes} bytes) from {cache.directory}: {kinds}")
            if cleared.left:
                print(f"left {len(cleared.left)} files there that are not the cache's")
        return 0
    info = cache.info()
    print(f"cache {info['directory']}: {info['bytes']} bytes; {info['hits']} hits, {info['misses']} misses")
    for kind, row in info["kinds"].items():
        print(f"  {kind}: {row['entries']} entries, {row['bytes']} bytes")
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    inspect = sub.add_parser("inspect", help="print a stage of the pipeline for a module")
    inspect.add_argument("module", help="a .wasm or .wat file")
    inspect.add_argument("--stage", choices=["wasm", "dialect", "loops", "llvm", "ptx"], default="dialect")
    inspect.add_argument("--func", help="only this function (index, export or debug name)")
    inspect.add_argument("--target", help="sm_75, sm_80, sm_90 or host (llvm and ptx stages)")
    inspect.add_argument(
        "--format", choices=["text", "json"], default="text", help="loops stage: output format"
    )
    inspect.add_argument("--relaxed-float", action="store_true",
                         help="loops stage: allow float reductions (they reorder operations)")  # fmt: skip
    inspect.set_defaults(run=cmd_inspect)


def _add_invoke(sub: argparse._SubParsersAction) -> None:
    invoke = sub.add_parser("invoke", help="call exported functions, one JSON line per call")
    invoke.add_argument("module", help="a .wasm or .wat file")
    invoke.add_argument("--backend", choices=["auto", "wasmtime", "cpu", "gpu"], default="auto",
                        help="auto: the GPU if there is one, else the host (default)")  # fmt: skip
    invoke.add_argument("--calls", required=True, help='JSON lines {"func": ..., "args": [...]}; - for stdin')
    invoke.add_argument("--target", choices=["sm_75", "sm_80", "sm_90"],
                        help="GPU code for this architecture instead of the device's")  # fmt: skip
    invoke.set_defaults(run=cmd_invoke)


def _add_compile(sub: argparse._SubParsersAction) -> None:
    compile_ = sub.add_parser("compile", help="compile ahead of time: PTX and a manifest")
    compile_.add_argument("module", help="a .wasm or .wat file")
    compile_.add_argument("-o", "--output", required=True, help="output directory")
    compile_.add_argument("--target", help="sm_75, sm_80, sm_90, or all (default: the GPU's, else all)")
    compile_.set_defaults(run=cmd_compile)


# The options of ``run`` that take one value, and the values each accepts (None: any);
# the run's parser (_add_run) and parse_run read them.
_RUN_VALUES: dict[str, tuple[str, ...] | None] = {
    "--offload": ("auto", "off", "always"),
    "--device": ("auto", "gpu", "cpu"),
    "--report": ("text", "json"),
    "--dir": None,
    "--env": None,
}


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a Wasm program on wasmtime with its parallel loops offloaded")
    run.add_argument("module", help="a .wasm or .wat file")
    run.add_argument("args", nargs="*", help="program arguments (or --invoke arguments)")
    run.add_argument("--invoke", nargs="+", metavar=("NAME", "ARG"),
                     help="call this export with these arguments instead of _start")  # fmt: skip
    run.add_argument("--offload", choices=_RUN_VALUES["--offload"], default="auto")
    run.add_argument("--device", choices=_RUN_VALUES["--device"], default="auto",
                     help="where offloaded loops run (auto: the GPU if there is one)")  # fmt: skip
    run.add_argument("--dir", action="append", help="preopen HOST[::GUEST] for WASI")
    run.add_argument("--env", action="append", metavar="NAME=VALUE",
                     help="an environment variable for the program (WASI; repeatable)")  # fmt: skip
    run.add_argument("--report", choices=_RUN_VALUES["--report"], help="print the offload report to stderr")
    run.add_argument("--relaxed-float", action="store_true", help="allow float reductions to be reordered")
    run.set_defaults(run=cmd_run)


def _add_cache(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="show or clear the compiled-code cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(run=cmd_cache)


def _add_devices(sub: argparse._SubParsersAction) -> None:
    devices = sub.add_parser("devices", help="list GPUs, their targets and the driver's PTX ISA")
    devices.set_defaults(run=cmd_devices)


def _added_by(module: str) -> Callable[[argparse._SubParsersAction], None]:
    """The adder of a subcommand defined in ``module``, above the runtime: its
    ``add_parser(subparsers)``, imported by name only when the parser is built."""

    def add(sub: argparse._SubParsersAction) -> None:
        import importlib

        importlib.import_module(module).add_parser(sub)

    return add


# The subcommands, in the order the help lists them: each one's adder, which gives its
# parser a ``run`` default (its handler: namespace -> exit status).
SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "inspect": _add_inspect,
    "invoke": _add_invoke,
    "compile": _add_compile,
    "run": _add_run,
    "fuzz": _added_by("tensorwasm.oracle.cli"),
    "cache": _add_cache,
    "devices": _add_devices,
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``only``, a subcommand's name, that subcommand alone
    (its arguments parse the same, and the other subcommands cost nothing to build)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tensorwasm", description="Compile WebAssembly to NVIDIA PTX and run it on the GPU."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add in SUBCOMMANDS.items():
        if only in (None, name):
            add(sub)
    return parser


def parse_run(argv: list[str]) -> SimpleNamespace | None:
    """The arguments of a plain ``run`` command line (its options before or after the
    module), as its parser would give them, without importing argparse (~2 ms of the
    program's start, with the locale module); None where the line is anything else (another
    command, ``--help``, ``--invoke``, an option written ``--name=value`` or abbreviated, a
    program argument that starts with ``-``, no module, an error): the parser then reads
    it, and says what is wrong."""
    if len(argv) < 2 or argv[0] != "run":
        return None
    args = SimpleNamespace(
        command="run", verbose=False, module=None, args=[], invoke=None, offload="auto",
        device="auto", dir=None, env=None, report=None, relaxed_float=False, run=cmd_run,
    )  # fmt: skip
    words = iter(argv[1:])
    for word in words:
        if not word.startswith("-"):  # the module, then the program's arguments
            if args.module is None:
                args.module = word
            else:
                args.args.append(word)
        elif word == "--relaxed-float":
            args.relaxed_float = True
        elif word in _RUN_VALUES:
            value = next(words, None)
            choices = _RUN_VALUES[word]
            if value is None or value.startswith("-") or (choices is not None and value not in choices):
                return None
            name = word[2:]
            if choices is None:  # (action="append")
                setattr(args, name, [*(getattr(args, name) or []), value])
            else:
                setattr(args, name, value)
        else:
            return None
    return args if args.module is not None else None


# One hardware work queue per CUDA context, where the environment does not choose another
# count: the driver then makes the primary context in about half the time (an H100, driver
# 580: cuDevicePrimaryCtxRetain 51-59 ms against 100-119 ms with the default 8), which a run
# whose loops need the GPU early waits for. A run's copies and launches go in order on one
# stream anyway; streams of a guest's own (wasi-cuda) then share the queue.
DEVICE_CONNECTIONS = 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config.default_device_connections(DEVICE_CONNECTIONS)  # (before any thread starts the driver)
    args = parse_run(argv)
    if args is None:
        args = _parse(argv)
    logs.configure(logs.INFO if args.verbose else logs.WARNING, format="tensorwasm: %(message)s")
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except TensorWasmError as exc:
        print(f"tensorwasm: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line's arguments, by its parser (which exits where they are wrong)."""
    # A command line that starts with its subcommand is parsed by that subcommand's parser
    # alone: a run, whose start-up is part of the program's time, builds no other.
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args, extra = build_parser(only).parse_known_args(argv)
    # Some argparse releases leave a run's program arguments unmatched when options come
    # first; whatever a run does not recognise belongs to the program.
    if extra and getattr(args, "run", None) is cmd_run:
        args.args = [*args.args, *extra]
    elif extra:  # said as the whole parser says it, its usage naming every subcommand
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def entry() -> None:
    """The ``tensorwasm`` command. Once the command is done, where no thread of its own but
    kernel compile workers is alive (Python's exit work waits for their compiles, whose
    code the cache keeps), the process ends once that exit work is done (the cache's
    counts, say), without the interpreter's teardown of every module and object (~15 ms
    after a run, where a worker was made: 60 to 90 ms on the H100's host, for memory the
    system frees with the process anyway): the command's output and the program's files
    are all written by then. So does it where the CUDA context is still being made (every
    loop stayed on the CPU before one was needed, so nothing of the program's is on the
    device): the process neither waits for the driver nor exits while the driver
    initialises on the other thread (begun at the start, or by an arrival whose launch would
    have paid: :mod:`runtime.gpu_start`); and where a context was made, without the
    driver's teardown of it (tens to hundreds of milliseconds at exit)."""
    status = main()
    gpu_start = sys.modules.get("tensorwasm.runtime.gpu_start")  # (a launch may have begun one)
    device_info = sys.modules.get("tensorwasm.runtime.device_info")
    threading_ = sys.modules.get("threading")
    if (
        (_cuda_start is not None and _cuda_start.is_alive())
        or (gpu_start is not None and gpu_start.STARTER.running())
        or (device_info is not None and device_info.context_made())
        or threading_ is None
        or all(_waited_at_exit(thread) for thread in threading_.enumerate())
    ):
        _exit_now(status)
    sys.exit(status)


def _waited_at_exit(thread) -> bool:
    """Whether ``thread`` is the main one, a kernel compile worker (the compiles under way
    are waited for by the exit work :func:`_exit_now` runs,
    :func:`runtime.loop_kernels.finish_compiles`, so that their code is cached), or one of
    the host backend's launch threads (idle: every launch waits for its threads)."""
    import threading

    if thread is threading.main_thread():
        return True
    kernels = sys.modules.get("tensorwasm.runtime.loop_kernels")  # (no worker where it is not loaded)
    host = sys.modules.get("tensorwasm.runtime.host_device")  # (where it is, its launches' threads)
    return (kernels is not None and thread.name.startswith(kernels.COMPILE_THREADS)) or (
        host is not None and thread.name.startswith(host.LAUNCH_THREADS)
    )


def _exit_now(status: int) -> None:
    """End the process with ``status`` after Python's exit work (``atexit``), its streams
    flushed and its log closed, without the interpreter's teardown."""
    import atexit

    atexit._run_exitfuncs()  # Python's exit work; the interpreter's (and the driver's) teardown is skipped
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    if "logging" in sys.modules:  # (imported only where a message was written)
        sys.modules["logging"].shutdown()
    os._exit(status)


if __name__ == "__main__":
    entry()
