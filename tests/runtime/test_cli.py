"""The CLI: inspect stages, function selection, .wat input, one-line errors with status 2."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwasm.runtime import cli
from tensorwasm.runtime.cli import main
from tests.conftest import ROOT

BLAS1 = ROOT / "examples/loops/build/blas1.O2.wasm"


def test_inspect_dialect_of_one_function(capsys) -> None:
    assert main(["inspect", str(BLAS1), "--stage", "dialect", "--func", "saxpy"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("func @saxpy(i32, f32, i32, i32) -> ()")
    assert "loop header" in out and "arith.fmul" in out
    assert "func @daxpy" not in out


def test_inspect_wasm_by_index(capsys) -> None:
    assert main(["inspect", str(BLAS1), "--stage", "wasm", "--func", "1"]) == 0
    out = capsys.readouterr().out
    assert "(func 1 $saxpy" in out and "f32.load" in out
    assert "(func 2 " not in out


def test_inspect_accepts_wat(tmp_path: Path, capsys) -> None:
    src = tmp_path / "m.wat"
    src.write_text('(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul))')
    assert main(["inspect", str(src), "--func", "sq"]) == 0
    assert "arith.mul %0, %0 : i32" in capsys.readouterr().out


def test_unknown_function_is_an_error(capsys) -> None:
    assert main(["inspect", str(BLAS1), "--func", "nope"]) == 2
    assert "no function named 'nope'" in capsys.readouterr().err


def test_bad_input_is_one_line_and_status_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(BLAS1.read_bytes()[:200])
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "inspect", str(bad)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("tensorwasm: error:") and "offset 0x" in lines[0]


def test_bad_wat_is_an_error(tmp_path: Path, capsys) -> None:
    src = tmp_path / "m.wat"
    src.write_text("(module (func i32.bogus))")
    assert main(["inspect", str(src)]) == 2
    assert "not valid WebAssembly text" in capsys.readouterr().err


def test_missing_file_is_an_error(capsys) -> None:
    assert main(["inspect", "/nonexistent.wasm"]) == 2
    assert "cannot read" in capsys.readouterr().err


DEMO = ROOT / "examples/invoke/demo.wat"
DEMO_CALLS = ROOT / "examples/invoke/demo.jsonl"


def test_invoke_cpu_prints_what_wasmtime_prints(capsys) -> None:
    assert main(["invoke", str(DEMO), "--backend", "wasmtime", "--calls", str(DEMO_CALLS)]) == 0
    reference = capsys.readouterr().out
    assert main(["invoke", str(DEMO), "--backend", "cpu", "--calls", str(DEMO_CALLS)]) == 0
    assert capsys.readouterr().out == reference
    lines = reference.splitlines()
    assert lines[0] == '{"results": [{"type": "i32", "value": "46368"}]}'
    assert lines[3] == '{"trap": "integer overflow"}'


def test_invoke_auto_without_gpu_says_so_and_uses_the_host(capsys) -> None:
    from tensorwasm.runtime import driver

    assert main(["invoke", str(DEMO), "--calls", str(DEMO_CALLS)]) == 0
    captured = capsys.readouterr()
    # Without a GPU auto says so and uses the host; with one it runs there, silently.
    assert ("running on the host backend (cpu)" in captured.err) == (not driver.devices())
    assert len(captured.out.splitlines()) == 5


def test_invoke_reports_bad_lines_and_continues(tmp_path: Path, capsys) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_text(
        '{"func": "fib", "args": [{"type": "i32", "value": "x"}]}\n'
        "not json\n"
        '{"func": "missing"}\n'
        '{"func": "fib", "args": [{"type": "i32", "value": "10"}]}\n'
    )
    assert main(["invoke", str(DEMO), "--backend", "cpu", "--calls", str(calls)]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [next(iter(o)) for o in out] == ["error", "error", "error", "results"]
    assert out[3]["results"][0]["value"] == "55"


def test_compile_writes_ptx_and_manifest(tmp_path: Path, capsys) -> None:
    src = tmp_path / "m.wat"
    src.write_text(
        '(module (import "env" "log" (func $log (param i32)))'
        ' (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul)'
        ' (func (export "noisy") (param i32) local.get 0 call $log))'
    )
    out = tmp_path / "out"
    assert main(["compile", str(src), "-o", str(out), "--target", "all"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["targets"] == ["sm_75", "sm_80", "sm_90"]
    kernels = [k for k in manifest["kernels"] if k["function"] == "sq"]
    assert {k["target"] for k in kernels} == {"sm_75", "sm_80", "sm_90"}
    for kernel in kernels:
        ptx = (out / kernel["file"]).read_bytes()
        assert hashlib.sha256(ptx).hexdigest() == kernel["sha256"]
        assert kernel["params"] == ["i32"] and kernel["results"] == ["i32"]
        assert f".entry {kernel['kernel']}".encode() in ptx
    (skipped,) = [s for s in manifest["skipped"] if s["function"] == "noisy"]
    assert "env.log" in skipped["reason"]
    assert "left out noisy" in capsys.readouterr().out


def test_a_second_identical_compile_is_served_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    """The second compile neither translates nor lowers: each target's output is a cache entry;
    another target, or a changed module, is compiled."""
    from tensorwasm.compiler import pipeline

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    assert main(["compile", str(BLAS1), "-o", str(first), "--target", "sm_80"]) == 0
    runs = []
    real_run = pipeline.run
    monkeypatch.setattr(pipeline, "run", lambda *a, **k: runs.append(a) or real_run(*a, **k))
    assert main(["compile", str(BLAS1), "-o", str(second), "--target", "sm_80"]) == 0
    assert runs == []
    assert sorted(p.name for p in second.iterdir()) == sorted(p.name for p in first.iterdir())
    for path in first.iterdir():
        assert (second / path.name).read_bytes() == path.read_bytes()
    assert main(["compile", str(BLAS1), "-o", str(third), "--target", "sm_90"]) == 0
    assert runs  # another target: compiled
    changed = tmp_path / "m.wat"
    changed.write_text(
        '(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul))'
    )
    runs.clear()
    assert main(["compile", str(changed), "-o", str(third), "--target", "sm_80"]) == 0
    assert runs and json.loads((third / "manifest.json").read_text())["kernels"][0]["function"] == "sq"


def test_inspect_llvm_and_ptx(capsys) -> None:
    assert main(["inspect", str(DEMO), "--stage", "llvm", "--func", "div"]) == 0
    llvm_ir = capsys.readouterr().out
    assert 'define void @"tw_call_3"' in llvm_ir and "sdiv i32" in llvm_ir
    assert main(["inspect", str(DEMO), "--stage", "ptx", "--func", "nearest", "--target", "sm_80"]) == 0
    ptx = capsys.readouterr().out
    assert ".target sm_80" in ptx and "cvt.rni.f32.f32" in ptx


def test_devices_without_gpu(capsys) -> None:
    from tensorwasm.runtime import driver

    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    if not driver.devices():
        assert out.startswith("no GPU:") and "host backend" in out
    else:
        assert "compute capability" in out


def test_fuzz_on_a_gpu_backend_without_a_gpu_says_so_and_saves_nothing(tmp_path, capsys, monkeypatch) -> None:
    from tensorwasm.runtime import driver

    def no_gpu(*args):
        raise driver.NoGPU("no usable GPU (this test)")

    monkeypatch.setattr(driver.Context, "get", staticmethod(no_gpu))  # the same on a GPU machine
    for backend in ("gpu", "offload-gpu"):
        status = main(["fuzz", "--backend", backend, "--max-examples", "3", "--save-dir", str(tmp_path)])
        assert status == 2
        assert f"the {backend} backend is not available" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_auto_without_a_gpu_prints_its_one_line(monkeypatch, capfd) -> None:
    """The library returns what it has to say; ``tensorwasm run`` prints it, as it always did."""
    from tensorwasm.runtime import driver, known_gpu

    def no_gpu(*args):
        raise driver.NoGPU("no usable GPU (this test)")

    monkeypatch.setattr(driver.Context, "get", staticmethod(no_gpu))  # the same on a GPU machine
    monkeypatch.setattr(driver.Context, "made", staticmethod(lambda ordinal=0: None))
    monkeypatch.setattr(known_gpu, "remembered", lambda: None)
    monkeypatch.setattr(known_gpu, "remembered_absence", lambda: None)
    monkeypatch.setattr(known_gpu, "remember_absence", lambda reason, lasting=True: None)
    monkeypatch.setattr(cli, "_may_launch", lambda raw, device: False)  # no thread making a context
    assert main(["run", str(DEMO), "--invoke", "fib", "20"]) == 0
    captured = capfd.readouterr()
    assert captured.out == "6765\n"
    assert captured.err == "tensorwasm: no usable GPU (this test); loops run on the host backend (cpu)\n"


def test_run_says_a_trap_in_one_line_with_status_134(tmp_path: Path, capfd) -> None:
    src = tmp_path / "trap.wat"
    src.write_text('(module (func (export "boom") unreachable))')
    assert main(["run", str(src), "--invoke", "boom", "--device", "cpu"]) == 134
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith("tensorwasm: the program trapped: ") and "unreachable" in line


def test_fuzz_is_found_by_its_module_name_and_its_help_is_the_oracles() -> None:
    from tensorwasm.oracle.cli import run_fuzz

    assert cli._parse(["fuzz", "--max-examples", "3"]).run is run_fuzz
    listed = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert "{inspect,invoke,compile,run,fuzz,cache,devices}" in listed.stdout
    done = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "fuzz", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert done.stdout.startswith("usage: tensorwasm fuzz") and "Differential fuzzing" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "p.wasm"],
        ["run", "p.wasm", "2000000", "--device", "cpu"],
        ["run", "p.wasm", "a", "--offload", "off", "b", "--report", "json", "c"],
        [
            "run",
            "p.wasm",
            "--relaxed-float",
            "--dir",
            "x::/y",
            "--dir",
            "z",
            "--env",
            "A=1",
            "--env",
            "B=",
            "5",
        ],
        ["run", "p.wasm", "--device", "auto", "--device", "gpu", "--offload", "always", "--report", "text"],
    ],
)
def test_a_plain_run_line_is_read_as_its_parser_reads_it(argv: list[str]) -> None:
    quick = cli.parse_run(argv)
    assert quick is not None
    assert vars(quick) == vars(cli._parse(argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--help"],
        ["run", "-h", "p.wasm"],
        ["run", "p.wasm", "--invoke", "f", "1"],
        ["run", "p.wasm", "--device=cpu"],
        ["run", "p.wasm", "--dev", "cpu"],
        ["run", "p.wasm", "--device", "tpu"],
        ["run", "p.wasm", "--device"],
        ["run", "p.wasm", "--env", "-x"],
        ["run", "p.wasm", "-5"],
        ["run", "p.wasm", "--", "x"],
        ["-v", "run", "p.wasm"],
        ["cache", "info"],
    ],
)
def test_any_other_line_is_left_to_the_parser(argv: list[str]) -> None:
    assert cli.parse_run(argv) is None


def test_the_quick_reading_knows_every_option_of_run() -> None:
    """An option added to ``run``'s parser must be known to :func:`cli.parse_run` too (or
    make it give up, as ``--invoke`` does)."""
    parser = cli.build_parser("run")
    run = next(a for a in parser._actions if a.dest == "command").choices["run"]
    options = {s for a in run._actions for s in a.option_strings if s.startswith("--")}
    assert options == {*cli._RUN_VALUES, "--relaxed-float", "--invoke", "--help"}


@pytest.mark.parametrize("chosen", [None, "4"])
def test_the_command_asks_for_one_hardware_queue_unless_the_environment_chose(
    chosen: str | None, monkeypatch, tmp_path: Path, capsys
) -> None:
    """CUDA makes a context with one hardware work queue in about half the time of its
    default eight (cli.DEVICE_CONNECTIONS); a count the user set is left as it is."""
    from tensorwasm.support import config

    name = config.DEVICE_CONNECTIONS
    monkeypatch.setenv(name, chosen or "")  # (undone after the test, whatever main sets)
    if chosen is None:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    assert main(["cache", "info"]) == 0
    assert os.environ[name] == (chosen or "1")
