"""What a warm ``tensorwasm run`` whose loops launch nothing pays beyond plain wasmtime.

Its loops arrive at the host and decline (a guard refuses: the stores overlap the loads),
so the guards and the planning run, but nothing that only a launch needs: no kernel is
compiled or loaded (LLVM, the lowering), no device memory is made (the mirror, the launch
side), no CUDA. Each check runs the real command (``cli.entry``) in a fresh process, on a
warm cache, and reads its ``sys.modules`` at the very end, after its report and its exit
work. The pieces that make the start cheap are checked on their own below: the quick
reading of the command line, the prepared-module entry, the records built without their
``__init__``, the process that ends without the interpreter's teardown.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwasm.runtime import cli
from tests.conftest import ROOT
from tests.runtime.test_run import plain_wasmtime

# _start runs a loop b[i] = a[i] * 3 over n elements, with b one element past a: every
# arrival's guard finds the stores overlapping the loads and declines, and wasmtime runs
# the loop. It then writes a letter for the first and the last element to stdout.
OVERLAP = """(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $scale (param $a i32) (param $b i32) (param $n i32)
    (local $i i32)
    (block $done
      (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
      (loop $l
        (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
          (i32.mul (i32.load (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))) (i32.const 3)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_s (local.get $i) (local.get $n))))))
  (func (export "_start")
    (local $k i32)
    (i32.store (i32.const 1024) (i32.const 1))
    (loop $again
      (call $scale (i32.const 1024) (i32.const 1028) (i32.const 4000))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br_if $again (i32.lt_s (local.get $k) (i32.const 3))))
    (i32.store8 (i32.const 64) (i32.add (i32.const 65) (i32.rem_u (i32.load (i32.const 1024)) (i32.const 26))))
    (i32.store8 (i32.const 65) (i32.add (i32.const 65) (i32.rem_u (i32.load (i32.const 17024)) (i32.const 26))))
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 2))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""

# What a warm run whose loops launch nothing never imports, on the host backend: the
# compiler's front and middle (the preparation is cached), its lowering and LLVM (no kernel
# is compiled), the launch side and device memory, the GPU's layers, and the standard
# modules a start can do without.
LAUNCH_ONLY = (
    "llvmlite.binding",
    "llvmlite.ir",
    "tensorwasm.compiler.lower.function",
    "tensorwasm.compiler.outline",
    "tensorwasm.compiler.analysis.loops",
    "tensorwasm.compiler.analysis.regions",  # (a region is read back as a record of its fields)
    "tensorwasm.compiler.frontend.decoder",
    "tensorwasm.dialect.ir",
    "tensorwasm.runtime.device_launch",
    "tensorwasm.runtime.mirror",
    "tensorwasm.runtime.device_replay",  # (the GPU's native replays)
    "tensorwasm.runtime.replay",
    "tensorwasm.runtime.driver",
    "tensorwasm.runtime.gpu_start",
    "tensorwasm.runtime.known_gpu",
    "cuda",
    "concurrent.futures",
    "dataclasses",  # with inspect, ~5 ms: the report and the guards' ranges are records
    "inspect",
    "argparse",  # options before the module are read by cli.parse_run too
    "copy",
    "hashlib",
    "pickle",
    "logging",
)

# The command, in a fresh process, with its modules written to the file named first when
# everything else is done (atexit runs the first registered last).
_ENTRY = """
import atexit, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(" ".join(sorted(sys.modules))))
from tensorwasm.runtime import cli
sys.argv = ["tensorwasm", *sys.argv[2:]]
cli.entry()
"""


def _command(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    modules = tmp_path / "modules"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["TENSORWASM_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY, str(modules), *args], capture_output=True, text=True, cwd=ROOT, env=env
    )
    return done, set(modules.read_text().split()) if modules.exists() else set()


def _imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if any(m == name or m.startswith(name + ".") for m in modules)]


def _overlap(tmp_path: Path) -> Path:
    path = tmp_path / "overlap.wat"
    path.write_text(OVERLAP)
    return path


def test_a_warm_run_whose_loops_decline_imports_nothing_only_a_launch_needs(tmp_path: Path) -> None:
    program = _overlap(tmp_path)
    line = ("run", "--device", "cpu", "--offload", "always", "--report", "json", str(program))
    cold, cold_modules = _command(tmp_path, *line)
    assert cold.returncode == 0, cold.stderr
    assert "tensorwasm.compiler.analysis.loops" in cold_modules  # (the check below can fail)
    warm, modules = _command(tmp_path, *line)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout == plain_wasmtime(program, [], tmp_path)[1]
    report = json.loads(warm.stderr.strip().splitlines()[-1])
    (row,) = [row for row in report["loops"] if row["device"]]
    assert row["arrivals"] == 3 and row["offloaded"] == 0
    assert all("overlap" in why or "disjoint" in why or "alias" in why for why in row["declined"]), row
    assert "tensorwasm.runtime.guards" in modules  # the arrivals were planned
    assert "tensorwasm.runtime.planning" in modules
    assert _imported(modules, LAUNCH_ONLY) == []


def test_the_program_output_and_status_survive_the_quick_exit(tmp_path: Path) -> None:
    program = tmp_path / "exit.wat"
    program.write_text(
        """(module
      (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 16) "no newline")
      (func (export "_start")
        (i32.store (i32.const 0) (i32.const 16))
        (i32.store (i32.const 4) (i32.const 10))
        (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
        (call $exit (i32.const 7))))"""
    )
    done, _ = _command(tmp_path, "run", "--device", "cpu", str(program))
    assert done.returncode == 7
    assert done.stdout == "no newline"
    counts = (tmp_path / "cache" / "counts").read_text()  # the cache's exit work ran
    assert counts.strip()


def test_the_interpreter_teardown_is_skipped_only_where_no_thread_of_the_command_works(
    tmp_path: Path,
) -> None:
    """A thread still working at the end (a kernel compiling in the background, whose entry
    the cache keeps) is waited for, as Python's own exit waits for it."""
    marker = tmp_path / "marker"
    script = f"""
import sys, threading, time
from tensorwasm.runtime import cli

def work():
    time.sleep(0.3)
    open({str(marker)!r}, "w").write("done")

cli.main = lambda: (threading.Thread(target=work).start(), 0)[1]
cli.entry()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "done"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--device", "cpu", "p.wasm"],
        ["run", "--device", "gpu", "--offload", "auto", "--report", "json", "p.wasm"],
        ["run", "--report", "text", "p.wasm", "1", "2"],
        ["run", "--env", "A=1", "p.wasm", "x", "--device", "cpu", "y"],
        ["run", "--relaxed-float", "p.wasm"],
    ],
)
def test_options_before_the_module_are_read_as_the_parser_reads_them(argv: list[str]) -> None:
    quick = cli.parse_run(argv)
    assert quick is not None
    assert vars(quick) == vars(cli._parse(argv))


@pytest.mark.parametrize("argv", [["run", "--device", "cpu"], ["run", "--report", "json", "-x", "p.wasm"]])
def test_a_line_without_a_module_or_with_a_dash_word_is_left_to_the_parser(argv: list[str]) -> None:
    assert cli.parse_run(argv) is None


def test_a_run_collects_no_garbage_while_it_starts_and_leaves_collection_on(tmp_path: Path, capfd) -> None:
    program = _overlap(tmp_path)
    seen = []
    from tensorwasm.runtime import run

    real = run.run

    def spy(*args, ready=None, **kwargs):
        seen.append(gc.isenabled())

        def check() -> None:
            seen.append(gc.isenabled())
            ready()
            seen.append(gc.isenabled())

        return real(*args, ready=check, **kwargs)

    run.run = spy
    try:
        assert cli.main(["run", "--device", "cpu", str(program)]) == 0
    finally:
        run.run = real
    assert seen == [False, False, True]  # off while it starts, on once the program runs
    assert gc.isenabled()
    gc.disable()  # a caller's choice is kept
    try:
        assert cli.main(["run", "--device", "cpu", str(program)]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_warm_start_reads_the_regions_and_the_rewritten_module_from_the_entry(
    tmp_path: Path, monkeypatch
) -> None:
    """The prepared-module entry: the rewritten module's bytes as they are, after the records,
    with its digest (which keys wasmtime's code); a region as a record of its fields."""
    import wasmtime

    from tensorwasm.runtime import prepared
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.offload import OffloadModule
    from tensorwasm.support.digest import sha256
    from tests.runtime.test_regions import time_loop

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    wasm = time_loop()
    cold = OffloadModule(wasm, device="cpu")
    (region,) = cold.regions
    blob = default_cache().get("prepared", cold.key)
    assert blob[:4] == prepared.MAGIC and blob.endswith(cold.rewritten)
    assert prepared.read(blob).rewritten_digest == sha256(cold.rewritten).hexdigest()
    default_cache().memory.clear()  # as a new process starts
    warm = OffloadModule(wasm, device="cpu")
    assert warm._preparation is None and warm.rewritten == cold.rewritten
    assert warm._rewritten_digest == sha256(cold.rewritten).hexdigest()
    (back,) = warm.regions
    assert type(back) is prepared.RegionRef
    fields = ("func_index", "start", "end", "offset", "children", "exits")
    assert [getattr(back, f) for f in fields] == [getattr(region, f) for f in fields]
    module = warm.compiled(wasmtime.Engine())  # wasmtime's code, found under that digest
    assert {imp.name for imp in module.imports} >= {"loop_0", "region_0"}


@pytest.mark.parametrize("cut", ["magic", "short"])
def test_a_prepared_entry_cut_short_or_of_another_release_is_prepared_again(cut: str) -> None:
    from tensorwasm.compiler.analysis.plan import AnalysisOptions
    from tensorwasm.compiler.prepare import prepare_offload
    from tensorwasm.runtime import prepared
    from tests.runtime.test_regions import time_loop

    blob = prepared.dump(prepare_offload(time_loop(), AnalysisOptions()).prepared)
    assert prepared.load(blob) is not None
    bad = b"TWP0" + blob[4:] if cut == "magic" else blob[: len(blob) // 2]
    assert prepared.load(bad) is None


def _rows(offload) -> list[tuple]:
    return [tuple(row) for row in offload.report_rows()]


def test_a_warm_start_builds_the_reports_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    wasm = module_bytes("stencil", "O2")
    cold = OffloadModule(wasm, device="cpu")
    assert any(row[5] is not None for row in _rows(cold)) and any(row[5] is None for row in _rows(cold))
    default_cache().memory.clear()  # as a new process starts
    warm = OffloadModule(wasm, device="cpu")
    assert warm._preparation is None
    assert _rows(warm) == _rows(cold)  # the offload report's rows, from the entry's plain part
    assert warm._entry is not None and warm._reports == []  # no report built for them
    reports = warm.reports
    assert warm._entry is None
    assert [(r.func.name, r.loop.offset, r.verdict, r.reason) for r in reports] == [
        (r.func.name, r.loop.offset, r.verdict, r.reason) for r in cold.reports
    ]
    for k, lp in enumerate(warm.loops):  # each offloaded loop's report holds the loop's own plan
        (own,) = [r for r in reports if r.plan is lp.plan]
        assert (own.func.name, own.loop.offset) == (lp.stats.func, lp.stats.offset) and _rows(warm)[
            reports.index(own)
        ][5] == k
    assert _rows(warm) == _rows(cold)


@pytest.mark.parametrize(
    "unbuildable",
    [
        b'["tensorwasm-records-1",[],["LoopReport"]]',  # its table right, its value not
        b"not a document",  # (parsed only where the reports are asked for: the rest is used)
    ],
)
def test_unreadable_cached_reports_are_taken_from_the_module_linked_to_its_loops(
    tmp_path: Path, monkeypatch, unbuildable: bytes
) -> None:
    from tensorwasm.runtime import prepared
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    wasm = module_bytes("stencil", "O2")
    cold = OffloadModule(wasm, device="cpu")
    entry = prepared.read(default_cache().get("prepared", cold.key))
    document = prepared.RECORDS.dumps(prepared.replace(entry.module, rewritten=b""), prepared._stand_in)
    rows = json.dumps(entry.rows).encode()
    default_cache().put("prepared", cold.key, prepared.entry([document, rows, unbuildable], cold.rewritten))
    default_cache().memory.clear()
    warm = OffloadModule(wasm, device="cpu")
    assert warm._preparation is None
    reports = warm.reports  # the module is prepared for them
    assert warm._preparation is not None
    for lp in warm.loops:
        assert len([r for r in reports if r.plan is lp.plan]) == 1
    assert _rows(warm) == _rows(cold)


@pytest.mark.gpu
def test_a_warm_gpu_run_whose_loops_decline_loads_no_cuda(tmp_path: Path) -> None:
    """On a GPU: the first run makes the context, remembers the device and that nothing
    launched; the next one starts no context, and its declines load neither CUDA nor the
    driver layer, device memory or LLVM."""
    program = _overlap(tmp_path)
    line = ("run", "--device", "gpu", "--offload", "always", "--report", "json", str(program))
    first, first_modules = _command(tmp_path, *line)
    assert first.returncode == 0, first.stderr
    assert "cuda.bindings.driver" in first_modules  # (the check below can fail)
    warm, modules = _command(tmp_path, *line)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == first.stdout == plain_wasmtime(program, [], tmp_path)[1]
    report = json.loads(warm.stderr.strip().splitlines()[-1])
    assert report["device"] == "gpu"
    (row,) = [row for row in report["loops"] if row["device"]]
    assert row["arrivals"] == 3 and row["offloaded"] == 0
    never = ("cuda", "tensorwasm.runtime.driver", "tensorwasm.runtime.mirror", "llvmlite.binding", "llvmlite.ir",
             "dataclasses", "argparse")  # fmt: skip
    assert _imported(modules, never) == []
