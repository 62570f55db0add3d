"""The bad-input fuzzer's verdicts: ``run`` may not refuse, for a proposal, a module that
wasmtime runs."""

from __future__ import annotations

import os
import sys

from tensorwasm.oracle import badinput
from tests.conftest import ROOT, wat

TAIL_CALLS = """(module
  (func $f (param i32) (result i32) (local.get 0))
  (func (export "_start") (drop (call $g (i32.const 1))))
  (func $g (param i32) (result i32) (return_call $f (local.get 0))))"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_run_of_a_module_using_an_unsupported_proposal_passes(tmp_path) -> None:
    module = tmp_path / "case.wasm"
    module.write_bytes(wat(TAIL_CALLS))
    assert badinput.check(module, "run", tmp_path, 120, 2048 << 10, _env()) is None
    # (the command that does refuse it is clean: refusing is its job)
    (tmp_path / "calls.jsonl").write_text("")
    assert badinput.check(module, "inspect", tmp_path, 120, 2048 << 10, _env()) is None


def test_a_run_that_refuses_such_a_module_is_a_failure(tmp_path, monkeypatch) -> None:
    module = tmp_path / "case.wasm"
    module.write_bytes(wat(TAIL_CALLS))
    refusal = "instruction return_call needs the tail calls proposal, which TensorWasm does not support"
    script = f"import sys; print('tensorwasm: error: {refusal}', file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(badinput, "_argv", lambda command, module, work: [sys.executable, "-c", script])
    why = badinput.check(module, "run", tmp_path, 60, 2048 << 10, _env())
    assert why is not None and why.startswith("refused a module wasmtime runs") and refusal in why
    module.write_bytes(b"\0asm\x01\0\0\0\x01")  # what wasmtime refuses too may be refused
    assert badinput.check(module, "run", tmp_path, 60, 2048 << 10, _env()) is None
