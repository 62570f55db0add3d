"""The CLI: inspect stages, function selection, .wat input, one-line errors with status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime.cli import main
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
        [sys.executable, "-m", "runtime.cli", "inspect", str(bad)],
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
