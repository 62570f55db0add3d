"""The compile-latency benchmark (``python -m benchmarks.compile --kernels``) measures a GPU
kernel as the runtime makes it: cold, its PTX and the cubin ptxas assembles where it
compiles; warm, both read from the code cache, with no compile and no ptxas."""

from __future__ import annotations

import pytest

from benchmarks import compile as bench
from tensorwasm.runtime import assembler


@pytest.fixture
def measured(ptxas: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))  # (the benchmark sets its own)
    runs: list[str] = []
    real = assembler.assemble
    monkeypatch.setattr(
        assembler, "assemble", lambda ptx, arch, driver: runs.append(arch) or real(ptx, arch, driver)
    )
    result = bench.measure_kernels("sm_90", repeat=1, limit=1, corpus="suite")
    result["assembled"] = runs
    return result


def test_a_suite_kernel_is_measured_cold_with_its_cubin_and_warm_from_the_cache(measured) -> None:
    assert measured["kernels"] == 1 and measured["corpus"] == "suite" and measured["cubin"]
    assert measured["assembled"] == ["sm_90"]  # once, cold; the warm read assembled nothing
    for key in ("ptx_cold", "ptx_warm", "host_cold", "host_warm"):
        assert measured[f"{key}_median_ms"] > 0
    assert measured["ptxas_per_kernel_ms"] > 0
    summary = bench.kernels_summary(measured)
    assert "of the suite corpus" in summary and "and its cubin (ptxas)" in summary


def test_the_bench_device_assembles_for_the_ptxas_found(ptxas: str, monkeypatch) -> None:
    from tensorwasm.compiler.target import NVPTXTarget

    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    device = bench.bench_device(NVPTXTarget("sm_80", (7, 0)))
    release = assembler.ptxas()[1]
    assert device.assumed.arch == "sm_80"
    assert divmod(device.assumed.driver_version // 10, 100) == release  # ptxas is used, not refused
