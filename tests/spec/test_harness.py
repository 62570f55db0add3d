"""The testsuite harness itself: each kind of check fails where the backend is wrong.

Hand-made command lists (wast2json's format) over small modules, so these run without the
testsuite or wast2json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.traps import TrapKind
from tests.conftest import wat
from tests.spec.harness import FileRun, Tally, trap_kind
from tests.spec.table import cell, current_cells, parse_cell, render

MODULE = """(module
  (global (export "g") i32 (i32.const 7))
  (func (export "seven") (result i32) (i32.const 7))
  (func (export "div") (param i32 i32) (result i32) (i32.div_s (local.get 0) (local.get 1)))
  (func (export "nan") (param i32) (result f32) (f32.reinterpret_i32 (local.get 0)))
  (func (export "is_null") (param externref) (result i32) (ref.is_null (local.get 0))))"""
IMPORTER = (
    '(module (import "spectest" "global_i32" (global i32)) (func (export "f") (result i32) (global.get 0)))'
)
# A module with two memories (a memory section of two entries, minimum 1 page each).
TWO_MEMORIES = b"\0asm\x01\0\0\0" + bytes([5, 5, 2, 0, 1, 0, 1])


def run(tmp_path: Path, commands: list[dict], backend: str = "cpu") -> Tally:
    (tmp_path / "m.wasm").write_bytes(wat(MODULE))
    (tmp_path / "importer.wasm").write_bytes(wat(IMPORTER))
    (tmp_path / "valid.wasm").write_bytes(wat("(module)"))
    (tmp_path / "invalid.wasm").write_bytes(TWO_MEMORIES)
    return FileRun("t", backend, {"commands": [{"type": "module", "line": 1, "filename": "m.wasm"}, *commands]},
                   tmp_path).run()  # fmt: skip


def invoke(field: str, *args: tuple[str, str]) -> dict:
    return {"type": "invoke", "field": field, "args": [{"type": t, "value": v} for t, v in args]}


def returns(line: int, action: dict, *expected: tuple[str, str]) -> dict:
    return {"type": "assert_return", "line": line, "action": action,
            "expected": [{"type": t, "value": v} for t, v in expected]}  # fmt: skip


@pytest.mark.parametrize("backend", ["cpu", "wasmtime"])
def test_right_results_pass_and_wrong_ones_fail(tmp_path: Path, backend: str) -> None:
    tally = run(tmp_path, [
        returns(2, invoke("seven"), ("i32", "7")),
        returns(3, invoke("seven"), ("i32", "8")),
        returns(4, {"type": "get", "field": "g"}, ("i32", "7")),
        returns(5, invoke("nan", ("i32", str(0x7FC00000))), ("f32", "nan:canonical")),
        returns(6, invoke("nan", ("i32", str(0x7FC00001))), ("f32", "nan:canonical")),
        returns(7, invoke("nan", ("i32", str(0x7FC00001))), ("f32", "nan:arithmetic")),
        returns(8, invoke("nan", ("i32", str(0x7FA00000))), ("f32", "nan:arithmetic")),
        returns(9, invoke("is_null", ("externref", "0")), ("i32", "0")),
        returns(10, invoke("is_null", ("externref", "null")), ("i32", "1")),
    ], backend)  # fmt: skip
    assert (tally.passed, tally.skipped) == (7, 0)
    assert [f.split(":")[1] for f in tally.failures] == ["3", "6", "8"]


def test_traps_must_be_of_the_named_kind(tmp_path: Path) -> None:
    div = invoke("div", ("i32", "1"), ("i32", "0"))
    tally = run(tmp_path, [
        {"type": "assert_trap", "line": 2, "action": div, "text": "integer divide by zero"},
        {"type": "assert_trap", "line": 3, "action": div, "text": "integer overflow"},
        {"type": "assert_trap", "line": 4, "action": invoke("seven"), "text": "unreachable"},
    ])  # fmt: skip
    assert tally.passed == 2
    assert [f.split(":")[1] for f in tally.failures] == ["3", "4"]


def test_refused_modules_must_be_refused(tmp_path: Path) -> None:
    tally = run(tmp_path, [
        {"type": "assert_invalid", "line": 2, "filename": "invalid.wasm", "text": "multiple memories",
         "module_type": "binary"},
        {"type": "assert_malformed", "line": 3, "filename": "valid.wasm", "text": "x", "module_type": "binary"},
        {"type": "assert_malformed", "line": 4, "filename": "nothing.wat", "text": "x", "module_type": "text"},
        {"type": "assert_uninstantiable", "line": 5, "filename": "valid.wasm", "text": "x"},
    ])  # fmt: skip
    assert tally.passed == 2  # the module, and the two memories refused
    assert [f.split(":")[1] for f in tally.failures] == ["3", "5"]  # the text one is not a check


def test_modules_importing_state_are_skipped_with_their_checks(tmp_path: Path) -> None:
    tally = run(tmp_path, [
        {"type": "module", "line": 2, "filename": "importer.wasm"},
        returns(3, invoke("f"), ("i32", "666")),
    ])  # fmt: skip
    assert (tally.passed, tally.failed, tally.skipped) == (1, 0, 2)
    assert "spectest.global_i32" in tally.skips[0]


def test_spec_trap_messages() -> None:
    assert trap_kind("uninitialized element 2") is TrapKind.INDIRECT_CALL_TO_NULL
    assert trap_kind("undefined element") is TrapKind.TABLE_OUT_OF_BOUNDS
    assert trap_kind("something else") is None


def test_table_keeps_the_other_backends_column() -> None:
    tally = Tally("i32", passed=3, failed=1, skipped=2)
    doc = render({"i32": {"cpu": cell(tally), "gpu": "5 passed, 0 failed, 0 skipped"}}, ["i32"])
    cells = current_cells(doc)
    assert parse_cell(cells["i32"]["cpu"]) == (3, 1, 2)
    assert parse_cell(cells["i32"]["gpu"]) == (5, 0, 0)
    assert parse_cell(current_cells(render({}, ["i32"]))["i32"]["gpu"]) is None


@pytest.mark.parametrize("backend", ["cpu", "wasmtime"])
def test_a_module_that_only_imports_globals_runs_when_they_link(tmp_path: Path, backend: str) -> None:
    """simd_linking's shape: a registered module's v128 globals imported by a module with
    nothing that could read them. It runs where its imports link by name, type and
    mutability, fails where they do not; one that could read them is still not run."""
    exporter = '(module (global (export "g") (mut v128) (v128.const i64x2 1 2)) (global (export "c") i32 (i32.const 3)))'
    importers = {
        "ok.wasm": '(module (import "M" "g" (global (mut v128))) (import "M" "c" (global i32)))',
        "immutable.wasm": '(module (import "M" "g" (global v128)))',
        "type.wasm": '(module (import "M" "c" (global i64)))',
        "name.wasm": '(module (import "M" "h" (global i32)))',
        "reads.wasm": '(module (import "M" "c" (global i32)) (func (export "f") (result i32) (global.get 0)))',
    }
    (tmp_path / "exporter.wasm").write_bytes(wat(exporter))
    for name, text in importers.items():
        (tmp_path / name).write_bytes(wat(text))
    commands = [
        {"type": "module", "line": 2, "filename": "exporter.wasm"},
        {"type": "register", "line": 3, "as": "M"},
    ]
    commands += [{"type": "module", "line": 4 + i, "filename": name} for i, name in enumerate(importers)]
    tally = run(tmp_path, commands, backend)
    assert (tally.passed, tally.failed, tally.skipped) == (3, 3, 1), tally
    assert tally.failures == [
        "t.wast:5: does not link: M.g is a mutable v128 global, imported as a v128 global",
        "t.wast:6: does not link: M.c is a i32 global, imported as a i64 global",
        "t.wast:7: does not link: M exports no global 'h'",
    ]
    assert tally.skips == ["t.wast:8: imports M.c: executors do not link modules"]
