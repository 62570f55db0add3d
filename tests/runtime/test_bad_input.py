"""Bad input a user can give every command: one line naming the cause, never a traceback.

Each case runs the command in a fresh process, as a user does, and checks its exit status
(2 for the user's error, 134 for a Wasm trap), that stderr is one line naming the cause,
and that no Python traceback reached the user.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import wasmtime

from tests.conftest import ROOT

WASI_PROGRAM = ROOT / "examples/wasi/build/histogram.O2.wasm"


def tensorwasm(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorwasm", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def one_line(done: subprocess.CompletedProcess, status: int, cause: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert cause in lines[0], lines[0]
    assert done.returncode == status, (done.returncode, done.stderr)


def module(tmp_path: Path, text: str, name: str = "case.wasm") -> Path:
    path = tmp_path / name
    path.write_bytes(wasmtime.wat2wasm(text))
    return path


def test_a_start_function_that_traps_is_a_trap_of_the_run(tmp_path: Path) -> None:
    path = module(tmp_path, '(module (func $s unreachable) (start $s) (func (export "_start")))')
    one_line(tensorwasm("run", path, "--device", "cpu"), 134, "trapped while it was instantiated: wasm trap")


def test_a_data_segment_out_of_bounds_is_a_trap_of_the_run(tmp_path: Path) -> None:
    path = module(tmp_path, '(module (memory 1) (data (i32.const 65535) "ab") (func (export "_start")))')
    one_line(tensorwasm("run", path, "--device", "cpu"), 134, "out of bounds memory access")


def test_a_wasi_program_without_an_exported_memory_is_one_line(tmp_path: Path) -> None:
    path = module(
        tmp_path,
        """(module
          (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
          (memory 1)
          (func (export "_start") (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))""",
    )
    one_line(tensorwasm("run", path, "--device", "cpu"), 2, "missing required memory export")


def test_a_missing_preopened_directory_is_one_line() -> None:
    done = tensorwasm("run", WASI_PROGRAM, "10", "--device", "cpu", "--dir", "/nonexistent/dir")
    one_line(done, 2, "--dir /nonexistent/dir: no such directory")


def test_calls_from_a_binary_file_are_one_line() -> None:
    done = tensorwasm(
        "invoke", ROOT / "examples/invoke/demo.wat", "--backend", "cpu", "--calls", WASI_PROGRAM
    )
    one_line(done, 2, "not UTF-8 text")


@pytest.mark.parametrize("command", ["inspect", "run", "invoke", "compile"])
def test_a_module_file_that_is_not_there_is_one_line(command: str, tmp_path: Path) -> None:
    extra = {
        "inspect": ["--stage", "wasm"],
        "run": [],
        "invoke": ["--calls", "-"],
        "compile": ["-o", tmp_path],
    }
    one_line(tensorwasm(command, tmp_path / "absent.wasm", *extra[command]), 2, "absent.wasm")


def test_compile_onto_a_file_is_one_line_and_leaves_the_file(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    done = tensorwasm("compile", ROOT / "examples/invoke/demo.wat", "-o", target, "--target", "sm_90")
    one_line(done, 2, "exists and is not a directory")
    assert target.read_text() == "keep me"


def test_the_module_is_read_once_so_it_may_come_through_a_pipe(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys; data = open(sys.argv[1], 'rb').read(); "
        "p = subprocess.run([sys.executable, '-m', 'tensorwasm', 'run', '/dev/stdin', '--device', 'cpu', "
        "'--invoke', 'f', '7'], input=data, capture_output=True, text=False); "
        "print(p.returncode, p.stdout.decode().strip(), p.stderr.decode().strip())"
    )
    path = module(
        tmp_path,
        '(module (func (export "f") (param i32) (result i32) (i32.mul (local.get 0) (i32.const 6))))',
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "0 42", done.stdout


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        (["1", "2"], "f takes 1 argument(s), got 2"),
        ([], "f takes 1 argument(s), got 0"),
        ([str(1 << 32)], f"{1 << 32} does not fit an i32"),
        ([str(-(1 << 31) - 1)], "does not fit an i32"),
        (["x1"], "cannot read 'x1' as i32"),
    ],
)
def test_invoke_arguments_must_match_the_function(tmp_path: Path, args: list[str], cause: str) -> None:
    path = module(tmp_path, '(module (func (export "f") (param i32) (result i32) (local.get 0)))')
    one_line(tensorwasm("run", path, "--device", "cpu", "--invoke", "f", *args), 2, cause)


def test_an_unsigned_i32_argument_keeps_its_bits(tmp_path: Path) -> None:
    path = module(tmp_path, '(module (func (export "f") (param i32) (result i32) (local.get 0)))')
    done = tensorwasm("run", path, "--device", "cpu", "--invoke", "f", str((1 << 32) - 1))
    assert done.returncode == 0 and done.stdout.strip() == "-1", done


def test_a_malformed_device_memory_limit_is_refused_on_every_device(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_DEVICE_MEMORY_LIMIT", "lots")
    path = module(tmp_path, '(module (func (export "f")))')
    one_line(
        tensorwasm("run", path, "--device", "cpu", "--invoke", "f"),
        2,
        "TENSORWASM_DEVICE_MEMORY_LIMIT='lots'",
    )


def test_an_unknown_device_in_the_library_is_named() -> None:
    import tensorwasm
    from tensorwasm.support.errors import TensorWasmError

    with pytest.raises(TensorWasmError, match="device must be auto, gpu or cpu, not 'tpu'"):
        tensorwasm.instantiate(wasmtime.Store(), wasmtime.wat2wasm("(module)"), [], device="tpu")


def test_ctrl_c_stops_a_run_at_once_while_wasm_runs(tmp_path: Path) -> None:
    import signal
    import time

    path = module(tmp_path, '(module (func (export "_start") (loop $l (br $l))))')
    child = subprocess.Popen(
        [sys.executable, "-m", "tensorwasm", "run", str(path), "--device", "cpu"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(3)  # well inside the endless loop
    assert child.poll() is None
    child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=5)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGINT
    assert "Traceback" not in child.stderr.read()


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_an_endless_stream_that_is_no_module_is_refused_at_its_first_bytes(command: str) -> None:
    extra = {"run": ["--device", "cpu"], "inspect": ["--stage", "wasm"]}
    one_line(tensorwasm(command, "/dev/zero", *extra[command], timeout=30), 2, "not a WebAssembly module")


def test_a_table_of_2_to_the_32_entries_is_refused_by_name(tmp_path: Path) -> None:
    path = module(tmp_path, "(module (table 4294967295 funcref))")
    one_line(
        tensorwasm("invoke", path, "--backend", "cpu", "--calls", "/dev/null"),
        2,
        "a table of 4294967295 entries",
    )


def test_invoke_of_a_module_declaring_4_gib_of_memory_costs_what_it_touches(tmp_path: Path) -> None:
    import resource

    path = module(
        tmp_path,
        '(module (memory (export "memory") 65536) (data (i32.const 100) "hi")'
        ' (func (export "f") (result i32) (i32.load8_u (i32.const 101))))',
    )
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"func": "f", "args": []}\n')
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = tensorwasm("invoke", path, "--backend", "cpu", "--calls", calls)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert done.returncode == 0 and '"value": "105"' in done.stdout, done
    assert peak_kib < 1 << 20 or peak_kib == before, f"peak {peak_kib >> 10} MiB for 4 GiB declared"
