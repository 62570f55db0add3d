"""``python -m benchmarks.trees``: two trees of the package on the same PolyBench build, each
tree's own code running (a process per run, in its tree), dumps compared with wasmtime's."""

from __future__ import annotations

import shutil

from benchmarks import trees
from tests.conftest import ROOT

MINI = ROOT / "benchmarks" / "polybench-support"


def _copy_of_the_package(to) -> None:
    for folder in ("tensorwasm", "dialect", "compiler", "runtime", "oracle"):
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__"))


def test_both_trees_run_the_program_and_match_wasmtime(tmp_path) -> None:
    base = tmp_path / "base"
    _copy_of_the_package(base)
    # The base tree says so where it runs: its own code, not this tree's, is what it times.
    (base / "tensorwasm" / "__init__.py").write_text(
        (ROOT / "tensorwasm" / "__init__.py").read_text()
        + "\nimport sys\nprint('base tree', file=sys.stderr)\n"
    )
    seen = []
    real = trees.run

    def run(command, tree, timeout, extra=None):
        done = real(command, tree, timeout, extra)
        seen.append((tree, "base tree" in done["stderr"]))
        return done

    trees.run, saved = run, trees.run
    try:
        row = trees.compare(
            "atax", MINI / "atax-mini.wasm", {"base": base, "this": ROOT}, "cpu", 1, True, 300
        )
    finally:
        trees.run = saved
    assert row["identical"], row
    assert row["base"]["kernel"] is not None and row["this"]["kernel"] is not None
    assert row["wasmtime_kernel"] is not None
    assert {marked for tree, marked in seen if tree == base} == {True}
    assert {marked for tree, marked in seen if tree == ROOT} == {False}
    assert "atax" in trees.line(row) and "identical" in trees.line(row)


def test_a_dump_unlike_wasmtime_s_is_reported(monkeypatch) -> None:
    def run(command, tree, timeout, extra=None):
        plain = "-c" in command
        return {"status": 0, "kernel": 0.01, "process": 0.1, "dump": "a" if plain else "b", "stderr": ""}

    monkeypatch.setattr(trees, "run", run)
    row = trees.compare("atax", MINI / "atax-mini.wasm", {"base": ROOT, "this": ROOT}, "cpu", 2, True, 300)
    assert not row["identical"] and "DIFFERENT" in trees.line(row)
    assert len(row["base"]["kernels"]) == 2


def test_a_base_without_the_package_is_refused(tmp_path, capsys) -> None:
    assert trees.main(["--base", str(tmp_path), "atax"]) == 2
    assert "holds no tensorwasm package" in capsys.readouterr().err


def test_the_base_alone_runs_with_the_variables_given(monkeypatch) -> None:
    # The same tree twice, the base with a setting of its own: each run sees its own.
    seen = []

    def run(command, tree, timeout, extra=None):
        seen.append(dict(extra or {}))
        return {"status": 0, "kernel": 0.01, "process": 0.1, "dump": "same", "stderr": ""}

    monkeypatch.setattr(trees, "run", run)
    off = {"TENSORWASM_HOST_WHILE_STARTING": "off"}
    row = trees.compare("atax", MINI / "atax-mini.wasm", {"base": ROOT, "this": ROOT}, "cpu", 2, False, 300,
                        {"base": off})  # fmt: skip
    assert row["identical"] and seen == [off, {}, off, {}, off, {}]  # untimed, then two rounds, alternating
    assert trees.main(["--base", str(ROOT), "--base-env", "NOEQUALS", "atax"]) == 2


def test_a_variable_given_to_the_base_reaches_its_process() -> None:
    import hashlib
    import sys

    probe = [sys.executable, "-c", "import os; print(os.environ.get('TW_TREES_PROBE', 'unset'))"]
    given = trees.run(probe, ROOT, 60, {"TW_TREES_PROBE": "base only"})
    assert given["status"] == 0 and given["dump"] == hashlib.sha256(b"base only\n").hexdigest()
    assert trees.run(probe, ROOT, 60)["dump"] == hashlib.sha256(b"unset\n").hexdigest()


def test_idle_sleeps_before_each_timed_run_and_not_before_the_untimed_ones(monkeypatch) -> None:
    events = []

    def run(command, tree, timeout, extra=None):
        events.append("run")
        return {"status": 0, "kernel": 0.01, "process": 0.1, "dump": "same", "stderr": ""}

    monkeypatch.setattr(trees, "run", run)
    monkeypatch.setattr(trees.time, "sleep", lambda seconds: events.append(seconds))
    trees.compare("atax", MINI / "atax-mini.wasm", {"base": ROOT, "this": ROOT}, "cpu", 2, False, 300, idle=1.5)
    assert events == ["run", "run"] + [1.5, "run"] * 4  # two untimed runs, then two rounds of two trees
