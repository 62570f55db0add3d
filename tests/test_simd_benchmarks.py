"""The scalar-against-SIMD table of ``scripts/gpu-check --simd`` (``python -m benchmarks.offload
--compare``), read from real runs on the host backend: the examples' JSON and the suite's."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from benchmarks.offload import simd_table, speedups
from tests.conftest import ROOT

# Run in a process of its own: WASI writes to the process's stdout, which pytest captures.
MEASURE = """
import dataclasses, json, sys
from benchmarks.offload import SIZES, measure
from benchmarks.programs import PROGRAMS
from benchmarks.runner import measure_program
simd = sys.argv[1] == "simd"
program = dataclasses.replace(PROGRAMS["saxpy"], simd=simd)
print(json.dumps({
    "examples": [measure("stencil", SIZES["small"]["stencil"], "cpu", "always", simd)],
    "suite": {"results": [measure_program(program, program.bind(program.sizes["small"][0]), "cpu", "always")]},
}))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """stencil (an example) and saxpy (the suite), each build once on the host backend."""
    env = {**os.environ, "TENSORWASM_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    found = {}
    for build in ("scalar", "simd"):
        done = subprocess.run([sys.executable, "-c", MEASURE, build], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr
        for kind, document in json.loads(done.stdout).items():
            found[(kind, build == "simd")] = document
    return found


@pytest.mark.parametrize("kind", ["examples", "suite"])
def test_the_table_puts_each_builds_speedup_side_by_side(runs: dict, kind: str) -> None:
    scalar, simd = runs[(kind, False)], runs[(kind, True)]
    (key,) = speedups(scalar)
    a, b = speedups(scalar)[key], speedups(simd)[key]
    assert a["identical"] and b["identical"] and a["launches"] > 0 and b["launches"] > 0, (a, b)
    lines = simd_table(scalar, simd)
    (row,) = [line for line in lines if line.startswith(f"| {key[0]} | {key[1]} |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    ratio = b["speedup"] / a["speedup"]
    assert cells[2:5] == [f"{a['speedup']:.2f}x", f"{b['speedup']:.2f}x", f"{ratio:.2f}"]
    assert cells[5] == ("yes" if abs(ratio - 1) <= 0.10 else "no")
    assert cells[6:] == [f"{a['launches']} / {b['launches']}", "yes"]
    assert lines[-1].endswith(f"{int(cells[5] == 'yes')} of 1 within 10% of the scalar build's speedup")


def test_the_table_says_no_outside_the_tolerance_and_names_a_differing_output(runs: dict) -> None:
    scalar = runs[("suite", False)]
    slower = copy.deepcopy(scalar)
    row = slower["results"][0]
    row["tensorwasm"]["warm"]["seconds"] *= 1.5  # the same build, 1.5 times slower
    row["tensorwasm"]["warm"]["identical_output"] = False
    (line,) = [x for x in simd_table(scalar, slower) if x.startswith("| saxpy")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == "0.67" and cells[5] == "no" and cells[7] == "NO"


def test_compare_reads_the_two_files(runs: dict, tmp_path) -> None:
    paths = []
    for simd in (False, True):
        path = tmp_path / f"{simd}.json"
        path.write_text(json.dumps(runs[("examples", simd)]))
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-m", "benchmarks.offload", "--compare", *paths], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == simd_table(*(runs[("examples", s)] for s in (False, True)))
