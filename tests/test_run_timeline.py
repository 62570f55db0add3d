"""``scripts/run-timeline``: one ``tensorwasm run`` with its main thread profiled and the
driver's calls timed; the program's output and status are the command's own."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_a_timeline_keeps_the_program_s_output_and_says_where_the_time_went(tmp_path) -> None:
    module = ROOT / "examples/wasi/build/histogram.O2.wasm"
    plain = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", "--device", "cpu", str(module), "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    out = tmp_path / "histogram"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/run-timeline"), str(out), "--device", "cpu", str(module), "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout  # the program's output, unchanged
    text = (tmp_path / "histogram.txt").read_text()
    first = text.splitlines()[0]
    assert first.startswith(f"tensorwasm run --device cpu {module} 1000: ") and first.endswith("status 0")
    assert "MainThread" in text and "run.prepare" in text  # the timeline's line of the preparation
    assert "cumulative" in text and (tmp_path / "histogram.prof").stat().st_size > 0


def test_a_timeline_says_what_each_loop_s_arrivals_did(tmp_path) -> None:
    module = ROOT / "examples/wasi/build/matmul.O2.wasm"
    out = tmp_path / "matmul"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/run-timeline"), str(out), "--device", "cpu", "--offload", "always",
         str(module), "64"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "matmul.txt").read_text()
    summary = text.split("arrivals by loop", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in summary.splitlines()[1:] if line.strip()]
    assert any(row.strip().startswith("main +0x") and " 1 launched" in row for row in rows), summary
    assert "arrival at main +0x" in text and ": launched" in text  # its line in the timeline
