"""The PolyBench/C harness (``python -m benchmarks.polybench``) on two programs built with it
and kept next to it (MINI dataset, so no clang is needed here): their dumps carry every bit
of each element, tensorwasm's equal plain wasmtime's, the loop counts come from its report,
and the docs section replaces its own markers' text and nothing else."""

from __future__ import annotations

import re

import pytest

from benchmarks import polybench
from tests.conftest import ROOT

BUILT = {
    name: ROOT / "benchmarks" / "polybench-support" / f"{name}-mini.wasm" for name in ("atax", "doitgen")
}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {name: polybench.measure(name, wasm, "cpu", "always", 1, 300) for name, wasm in BUILT.items()}


def test_a_dump_is_the_time_then_every_element_s_bits() -> None:
    done = polybench.run_plain(BUILT["atax"], 300)
    assert done["status"] == 0 and done["kernel"] is not None and done["kernel"] >= 0
    assert done["dump"].startswith("==BEGIN DUMP_ARRAYS==\nbegin dump: y")
    elements = re.findall(r"\b[0-9a-f]{16}\b", done["dump"])
    assert len(elements) == 42  # atax MINI: y has N = 42 doubles
    assert not re.search(r"\d\.\d\d ", done["dump"])  # no two-decimal element left


@pytest.mark.parametrize("name", sorted(BUILT))
def test_outputs_equal_wasmtime_and_loops_launch(rows: dict, name: str) -> None:
    row = rows[name]
    assert row["identical_output"], row.get("error")
    assert row["dump_bytes"] > 0
    loops = row["loops"]
    assert 0 < loops["launched"] <= loops["candidates"]
    assert loops["launches"] > 0 and loops["arrivals"] >= loops["launches"]
    assert row["wasmtime"]["kernel"] is not None and row["tensorwasm"]["kernel"] is not None
    assert row["process_speedup"] == row["wasmtime"]["process"] / row["tensorwasm"]["process"]
    assert "calls import wasi_snapshot_preview1.fd_write" in loops["rejected"]


def test_a_different_dump_is_not_identical(rows: dict, monkeypatch) -> None:
    real = polybench.run_tensorwasm

    def flipped(*args):
        done = real(*args)
        done["dump"] = done["dump"].replace("0", "1", 1)
        return done

    monkeypatch.setattr(polybench, "run_tensorwasm", flipped)
    assert not polybench.measure("atax", BUILT["atax"], "cpu", "always", 1, 300)["identical_output"]


def test_the_docs_section_replaces_its_own_text_only(rows: dict, tmp_path) -> None:
    doc = {"schema": polybench.SCHEMA, "dataset": "MINI", "device": "cpu", "offload": "always", "repeat": 1,
           "environment": polybench.environment(), "results": list(rows.values()),
           "summary": polybench.summary(list(rows.values()))}  # fmt: skip
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nbefore\n")
    polybench.write_docs(doc, md, tmp_path / "img")
    once = md.read_text()
    assert once.startswith("# Benchmarks\n\nbefore\n\n" + polybench.BEGIN)
    assert "Outputs identical: 2/2." in once and "| atax | yes |" in once and "| doitgen | yes |" in once
    md.write_text(once + "\nafter\n")
    polybench.write_docs(doc, md, tmp_path / "img")
    assert md.read_text() == once + "\nafter\n"  # the same section in the same place


def test_the_command_refuses_a_missing_tree(tmp_path, capsys) -> None:
    assert polybench.main(["--src", str(tmp_path), "--only", "atax"]) == 2
    assert "no PolyBench/C tree" in capsys.readouterr().err


def test_summary_geomeans() -> None:
    rows = [
        {"kernel_speedup": 4.0, "process_speedup": 0.5, "identical_output": True, "loops": {"launched": 1, "candidates": 3}},
        {"kernel_speedup": 1.0, "process_speedup": 2.0, "identical_output": False, "loops": {"launched": 0, "candidates": 2}},
    ]  # fmt: skip
    s = polybench.summary(rows)
    assert s["kernel_geomean"] == pytest.approx(2.0) and s["process_geomean"] == pytest.approx(1.0)
    assert (s["identical"], s["slower_than_1_05"], s["launched"], s["candidates"]) == (1, 1, 1, 5)


def test_the_package_s_bytecode_is_written_even_where_python_writes_none(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1 does
    for folder in polybench.PACKAGE_DIRS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mod.py").write_text("X = 1\n")
    assert polybench.compile_bytecode(tmp_path)
    for folder in polybench.PACKAGE_DIRS:
        assert [p.suffix for p in (tmp_path / folder / "__pycache__").iterdir()] == [".pyc"]
    (tmp_path / "runtime" / "bad.py").write_text("def (\n")
    assert not polybench.compile_bytecode(tmp_path)
