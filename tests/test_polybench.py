"""The PolyBench/C harness (``python -m benchmarks.polybench``) on two programs built with it
and kept next to it (MINI dataset, so no clang is needed here): their dumps carry every bit
of each element, tensorwasm's equal plain wasmtime's, the loop counts come from its report,
and the docs section replaces its own markers' text and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

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


@pytest.mark.parametrize(("seconds", "timed"), [(0.1, polybench.SHORT_REPEAT), (1.0, 5), (3.0, 2)])
def test_a_short_program_runs_more_times(monkeypatch, seconds: float, timed: int) -> None:
    """Runs that fit ``short_seconds`` (5 here) by the untimed pair's time are added, up to
    SHORT_REPEAT; a long program runs ``repeat`` times (2 here)."""
    calls = {"plain": 0, "tensorwasm": 0}

    def run(kind: str):
        def fake(*args, **kwargs) -> dict:
            calls[kind] += 1
            return {"status": 0, "kernel": seconds / 10, "process": seconds / 2, "dump": "00", "report": None,
                    "stderr": ""}  # fmt: skip

        return fake

    monkeypatch.setattr(polybench, "run_plain", run("plain"))
    monkeypatch.setattr(polybench, "run_tensorwasm", run("tensorwasm"))
    row = polybench.measure("atax", Path("atax.wasm"), "cpu", "auto", 2, 60, short_seconds=5.0, warmup=3)
    assert calls == {"plain": 1 + timed, "tensorwasm": 3 + timed}  # (its warm-up: three runs)
    assert len(row["wasmtime"]["processes"]) == timed and row["identical_output"]


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


def _small_doc() -> dict:
    def row(name: str, kernel: float | None, process: float) -> dict:
        loops = {"candidates": 2, "launched": 1, "arrivals": 3, "launches": 1, "declined": {}, "rejected": {}}
        return {"program": name, "identical_output": True, "kernel_speedup": kernel, "process_speedup": process,
                "wasmtime": {"kernel": 0.1, "process": 0.2}, "tensorwasm": {"kernel": 0.1, "process": 0.2},
                "loops": loops}  # fmt: skip

    rows = [row("gemm", 100.0, 10.0), row("a<b&c", 0.5, 1.0), row("no-timer", None, 0.1)]
    return {"schema": polybench.SCHEMA, "dataset": "MINI", "device": "gpu", "offload": "auto", "repeat": 1,
            "environment": {"date": "d", "cpu": "c", "cpu_count": 1, "python": "3", "commit": "x"},
            "results": rows, "summary": polybench.summary(rows)}  # fmt: skip


def test_the_plot_is_an_svg_of_bars_on_a_log_scale_around_1x() -> None:
    import xml.etree.ElementTree as ET

    doc = _small_doc()
    text = polybench.svg_plot(doc)
    assert text == polybench.svg_plot(doc)  # the same file for the same data
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(text)
    bars = {
        b.find("s:title", ns).text: b
        for b in root.iterfind("s:rect", ns)
        if b.find("s:title", ns) is not None
    }
    assert sorted(bars) == sorted(
        [
            "gemm, kernel (PolyBench timer): 100x",
            "gemm, whole process: 10x",
            "a<b&c, kernel (PolyBench timer): 0.5x",
            "a<b&c, whole process: 1x",
            "no-timer, whole process: 0.1x",
        ]
    )  # fmt: skip  (no kernel bar where PolyBench's timer gave none)
    lines = {
        t.text: float(t.get("y")) - 4 for t in root.iterfind("s:text", ns) if t.text and t.text.endswith("x")
    }
    assert sorted(lines, key=lines.get) == ["100x", "10x", "1x", "0.1x"]  # decades from 0.1x to 100x
    decade = lines["1x"] - lines["10x"]
    assert lines["0.1x"] - lines["1x"] == pytest.approx(decade, abs=0.2) and decade > 0

    def span(title: str) -> tuple[float, float]:
        bar = bars[title]
        top = float(bar.get("y"))
        return top, top + float(bar.get("height"))

    assert span("gemm, kernel (PolyBench timer): 100x") == pytest.approx(
        (lines["100x"], lines["1x"]), abs=0.2
    )
    assert span("gemm, whole process: 10x") == pytest.approx((lines["10x"], lines["1x"]), abs=0.2)
    top, bottom = span("a<b&c, kernel (PolyBench timer): 0.5x")  # a loss hangs below 1x
    assert top == pytest.approx(lines["1x"], abs=0.2) and bottom - top == pytest.approx(
        0.301 * decade, abs=0.2
    )
    assert span("no-timer, whole process: 0.1x") == pytest.approx((lines["1x"], lines["0.1x"]), abs=0.2)


def test_the_docs_are_written_again_from_the_json(tmp_path, capsys) -> None:
    import json

    doc = _small_doc()
    first = tmp_path / "first"
    polybench.write_docs(doc, _md(first), first / "img")
    saved = first / "data" / "polybench-mini-gpu.json"
    assert json.loads(saved.read_text()) == doc
    again = tmp_path / "again"
    md = _md(again)
    assert (
        polybench.main(["--from-json", str(saved), "--docs", "--md", str(md), "--img", str(again / "img")])
        == 0
    )
    section = md.read_text()
    assert section == (first / "benchmarks.md").read_text()
    assert "](img/polybench-speedup-mini-gpu.svg)" in section and "(data/polybench-mini-gpu.json)" in section
    svg = (again / "img" / "polybench-speedup-mini-gpu.svg").read_text()
    assert svg == polybench.svg_plot(doc) == (first / "img" / "polybench-speedup-mini-gpu.svg").read_text()
    (tmp_path / "bad.json").write_text("{}")
    assert polybench.main(["--from-json", str(tmp_path / "bad.json"), "--docs"]) == 2
    assert "not a results file" in capsys.readouterr().err


def _md(folder):
    folder.mkdir()
    md = folder / "benchmarks.md"
    md.write_text("# Benchmarks\n")
    return md


def test_the_parts_of_one_sitting_merge_into_one_table(tmp_path, capsys) -> None:
    """A sitting run in two commands (each under the device's time limit) is one table: every
    program's row once, a later part's row in place of an earlier one, the summary over all;
    parts of different settings or trees do not merge."""
    import json

    first, second = _small_doc(), _small_doc()
    second["results"] = [dict(r, program="b" + r["program"]) for r in second["results"][:2]]
    second["results"].append(dict(first["results"][0], kernel_speedup=50.0))  # gemm measured again
    paths = []
    for k, doc in enumerate((first, second)):
        paths.append(tmp_path / f"part{k}.json")
        paths[-1].write_text(json.dumps(doc))
    assert polybench.main(["--from-json", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "polybench-mini-gpu-merged.json").read_text())
    names = [r["program"] for r in doc["results"]]
    assert sorted(names) == sorted(["a<b&c", "no-timer", "bgemm", "ba<b&c", "gemm"]) and len(set(names)) == 5
    assert next(r for r in doc["results"] if r["program"] == "gemm")["kernel_speedup"] == 50.0
    assert doc["summary"] == polybench.summary(doc["results"]) and doc["summary"]["programs"] == 5
    assert "| bgemm |" in table and "| gemm |" in table
    second["environment"]["commit"] = "y"
    paths[1].write_text(json.dumps(second))
    assert polybench.main(["--from-json", *map(str, paths), "--out", str(tmp_path / "out")]) == 2
    assert "commit differs" in capsys.readouterr().err


def test_the_commit_recorded_says_when_the_files_are_not_head_s(tmp_path, monkeypatch) -> None:
    """A tree whose tracked files differ from its HEAD (uncommitted changes, or a copy whose
    history is older than its files) is recorded as HEAD's hash with ``-dirty``; a name given
    in TENSORWASM_COMMIT is taken as it is."""
    import subprocess

    import benchmarks

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.setattr(benchmarks, "ROOT", tmp_path)
    monkeypatch.delenv("TENSORWASM_COMMIT", raising=False)
    assert benchmarks.source_commit() == head
    (tmp_path / "f.txt").write_text("two\n")
    assert benchmarks.source_commit() == f"{head}-dirty"
    monkeypatch.setenv("TENSORWASM_COMMIT", "abc")
    assert benchmarks.source_commit() == "abc"
