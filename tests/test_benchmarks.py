"""The benchmark suite (``python -m benchmarks``) on the host backend: its programs' kernel
loops are offloadable, the peers' NumPy data is the programs' own, every output equals plain
wasmtime's, the JSON has what the report reads, and the report renders (its plots only where
matplotlib is installed)."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest

from benchmarks import report
from benchmarks.peers import KERNEL_PEERS, bandwidth, workloads
from benchmarks.programs import PROGRAMS
from benchmarks.runner import attach_peers, run_family, run_wasmtime
from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tests.conftest import ROOT

# A bandwidth-bound map, a float reduction (--relaxed-float) and a time-stepped nest.
RUN_PROGRAMS = "saxpy,dot,stencil2d"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, "-m", "benchmarks", "--sizes", "small", "--device", "cpu", "--offload", "always",
               "--programs", RUN_PROGRAMS, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "peers skipped: --device cpu" in done.stdout
    return json.loads((out / "benchmarks-small-cpu.json").read_text())


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_kernel_loops_are_offloadable(name: str) -> None:
    program = PROGRAMS[name]
    module = translate_module(load(program.wasm.read_bytes()))
    reports = analyze_module(module, AnalysisOptions(relaxed_float=program.relaxed_float))
    mine = [r for r in reports if r.func.name == program.kernel_function]
    assert any(r.verdict == "offload" for r in mine), [(r.loop.offset, r.reason) for r in mine]


@pytest.mark.parametrize("name", ["saxpy", "dot", "reduce", "condmap", "stencil2d", "stencil3d"])
def test_peer_data_is_the_programs_data(name: str) -> None:
    """NumPy rebuilds each program's data bit for bit: for kernels that NumPy computes in the
    same order, its result printed the program's way is the program's own output."""
    program = PROGRAMS[name]
    params = program.bind(program.sizes["small"][0])
    expected = run_wasmtime(program.wasm, program.argv(params))["output"]
    assert workloads.output_line(name, params, workloads.reference(name, params)) == expected


def test_outputs_equal_wasmtime(results: dict) -> None:
    assert [row["program"] for row in results["results"]] == RUN_PROGRAMS.split(",")
    for row in results["results"]:
        assert row["identical_output"], row["program"]
        for phase in ("cold", "warm"):
            run = row["tensorwasm"][phase]
            assert run["identical_output"] and run["output"] == row["wasmtime"]["output"]
        assert not row["tensorwasm"]["cold"]["cache_hit"]
        assert row["tensorwasm"]["warm"]["cache_hit"]


def test_results_have_what_the_report_reads(results: dict) -> None:
    top = {"schema", "sizes", "device", "environment", "startup", "peers", "bandwidth", "results"}
    assert top <= set(results)
    assert results["device"] == "cpu" and results["bandwidth"] is None
    assert results["environment"]["packages"]["wasmtime"]
    for family, peer in results["peers"].items():
        assert peer["status"] == "skipped" and "--device cpu" in peer["reason"], family
    for row in results["results"]:
        program = PROGRAMS[row["program"]]
        assert row["params"] == program.bind(program.sizes["small"][0])
        assert row["bytes"] > 0 and row["category"] == program.category
        assert {"seconds", "compile_seconds", "run_seconds", "status"} <= set(row["wasmtime"])
        warm = row["tensorwasm"]["warm"]
        for key in ("seconds", "compile_seconds", "compile_seconds_per_kernel", "kernel_seconds",
                    "transfer_seconds", "on_wasmtime_seconds", "launches", "loops"):  # fmt: skip
            assert key in warm, key
        kernel = warm["kernel"]
        assert kernel["launches"] == kernel["arrivals"] > 0, row["program"]
        assert kernel["device_seconds"] is None  # CUDA events only on the GPU
        assert set(row["peers"]) == set(KERNEL_PEERS)
        assert all("skipped" in peer for peer in row["peers"].values())


def test_report_renders(results: dict, tmp_path) -> None:
    source = tmp_path / "results.json"
    source.write_text(json.dumps(results))
    md, img = tmp_path / "benchmarks.md", tmp_path / "img"
    assert report.main([str(source), "--md", str(md), "--img", str(img)]) == 0
    text = md.read_text()
    for heading in ("## Targets", "## Copy bandwidth", "## End to end", "## Kernels", "## Peers"):
        assert heading in text
    for name in RUN_PROGRAMS.split(","):
        assert f"| {name} |" in text
    assert "| output identical to plain wasmtime | 3 of 3 runs | met |" in text
    if importlib.util.find_spec("matplotlib") is None:
        assert "Not drawn: matplotlib is not installed" in text
        assert not img.exists()
    else:
        for name in (report.TIME_PLOT, report.SPEEDUP_PLOT):
            assert (img / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"](img/{name})" in text


def test_report_compares_with_peers(results: dict) -> None:
    """A run shaped as on a GPU: the ratios and the targets' verdicts come from its numbers."""
    doc = copy.deepcopy(results)
    doc["device"] = "gpu"
    doc["bandwidth"] = {"dtod": 1000.0}
    for family in KERNEL_PEERS:
        doc["peers"][family]["status"] = "ok"
    saxpy = next(row for row in doc["results"] if row["program"] == "saxpy")
    saxpy["tensorwasm"]["warm"]["kernel"]["device_seconds"] = saxpy["bytes"] / 900e9  # 900 GB/s
    saxpy["peers"] = {"nvcc": {"seconds": saxpy["bytes"] / 1000e9}, "numba-cuda": {"seconds": saxpy["bytes"] / 450e9},
                      "cupy": {"error": "a broken peer"}}  # fmt: skip
    text = report.render(doc, None, "results.json")
    row = next(line for line in text.splitlines() if line.startswith("| saxpy |") and "GB/s" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[6:9] == ["1.11x", "0.50x", "-"]  # against nvcc, numba-cuda, CuPy
    assert cells[9:] == ["900 GB/s", "90%"]
    targets = text[text.index("## Targets") : text.index("## Copy bandwidth")]
    assert "| kernel time <= 1.25x nvcc | 1 of 1 programs; saxpy 1.11x | met |" in targets
    assert "| kernel time <= numba-cuda | 1 of 1 programs; saxpy 0.50x | met |" in targets
    assert "saxpy: CuPy: a broken peer" not in text and "saxpy n=4096 reps=2 CuPy: a broken peer" in text


def test_peer_results_attach_to_rows(results: dict) -> None:
    rows = copy.deepcopy(results["results"])
    saxpy = rows[0]
    check = {"passed": True, "max_error": 0.0}
    timed = {"params": saxpy["params"], "seconds": 1e-5, "output": saxpy["wasmtime"]["output"]}
    documents = {
        "nvcc": {"status": "ok", "programs": {"saxpy": {"check": check, "sizes": [timed]}}},
        "numba-cuda": {"status": "error", "reason": "it broke"},
        "cupy": {"status": "ok", "programs": {"saxpy": {"skipped": "no such operation"}}},
    }
    attach_peers(rows, documents)
    expected = {"seconds": 1e-5, "output": timed["output"], "identical_output": True, "check": check}
    assert saxpy["peers"]["nvcc"] == expected
    assert saxpy["peers"]["numba-cuda"] == {"error": "it broke"}
    assert saxpy["peers"]["cupy"] == {"skipped": "no such operation"}
    assert rows[1]["peers"]["nvcc"] == {"error": "no result for this size"}


def test_peer_family_runs_in_its_own_process() -> None:
    """The copy family through the runner's subprocess: measured on a GPU, skipped without one."""
    document = run_family("copy", "small", [PROGRAMS["saxpy"]], timeout=300)
    assert document["peer"] == "copy"
    if document["status"] == "ok":
        assert tuple(document["gbps"]) == bandwidth.KINDS
        assert all(rate > 0 for rate in document["gbps"].values())
    else:
        assert document["status"] == "skipped" and document["reason"], document


@pytest.mark.gpu
@pytest.mark.slow
def test_suite_on_the_gpu(tmp_path) -> None:
    """The whole runner on a GPU at the small sizes: outputs equal wasmtime's, events time the
    kernels, and every peer that can run passes its check (nvcc's output equals wasmtime's)."""
    command = [sys.executable, "-m", "benchmarks", "--sizes", "small", "--device", "gpu", "--offload", "always",
               "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "benchmarks-small-gpu.json").read_text())
    assert doc["bandwidth"] and doc["bandwidth"]["dtod"] > 0
    for row in doc["results"]:
        assert row["identical_output"], row["program"]
        assert row["tensorwasm"]["warm"]["kernel"]["device_seconds"] is not None, row["program"]
        nvcc = row["peers"]["nvcc"]
        assert nvcc.get("identical_output") and nvcc["check"]["passed"], (row["program"], nvcc)
        for family in ("numba-cuda", "cupy"):
            peer = row["peers"][family]
            assert "error" not in peer, (row["program"], family, peer)
            assert "skipped" in peer or peer["check"]["passed"], (row["program"], family, peer)


def test_the_example_programs_benchmark_runs_on_the_host_backend() -> None:
    command = [sys.executable, "-m", "benchmarks.offload", "--device", "cpu", "--sizes", "small", "--json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {row["program"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"matmul", "stencil", "blur", "histogram", "nbody"}
    for row in rows.values():
        assert row["cold"]["identical_output"] and row["warm"]["identical_output"], row["program"]
    assert rows["histogram"]["warm"]["launches"] == 0
    assert rows["histogram"]["fresh_process"]["tensorwasm_seconds"] > 0


def test_report_keeps_the_sections_other_benchmarks_wrote(tmp_path) -> None:
    from benchmarks.report import kept_sections

    md = tmp_path / "benchmarks.md"
    md.write_text(
        "# old report\n\n<!-- polybench:begin -->\n## PolyBench\nrow\n<!-- polybench:end -->\n"
        "old text\n<!-- codegen:begin -->\n## Code generators\n<!-- codegen:end -->\n"
    )
    kept = kept_sections(md)
    assert "old report" not in kept and "old text" not in kept
    assert kept.index("## PolyBench\nrow") < kept.index("## Code generators")
    assert kept_sections(tmp_path / "missing.md") == ""
