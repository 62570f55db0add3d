"""``python -m benchmarks.codegen``: its arguments, its comparison of the two code generators
and its table, on made-up timings; without a GPU it says so and exits 2."""

from __future__ import annotations

import pytest

from benchmarks import codegen


def test_arguments_are_checked() -> None:
    args = codegen.parse_args(["--sizes", "large", "--programs", "saxpy,gemm", "--runs", "3"])
    assert (args.sizes, args.programs, args.runs) == ("large", "saxpy,gemm", 3)
    with pytest.raises(SystemExit):
        codegen.parse_args(["--programs", "saxpy,nosuch"])
    with pytest.raises(SystemExit):
        codegen.parse_args(["--runs", "0"])


def test_the_faster_generator_is_chosen_only_where_outputs_are_exact() -> None:
    fast_nvvm = {
        "llvm": {"kernels": {"tw_kernel_1": 2e-3, "tw_kernel_2": 1e-3}, "identical_output": True},
        "nvvm": {"kernels": {"tw_kernel_1": 1e-3, "tw_kernel_2": 4e-3}, "identical_output": True},
    }
    rows = codegen.compare("gemm", "n=64", fast_nvvm)
    assert [(r["kernel"], r["ratio"], r["choice"]) for r in rows] == [
        ("tw_kernel_1", 2.0, "nvvm"),
        ("tw_kernel_2", 0.25, "llvm"),
    ]
    fast_nvvm["nvvm"]["identical_output"] = False
    assert {r["choice"] for r in codegen.compare("gemm", "n=64", fast_nvvm)} == {"llvm"}
    one_sided = {"llvm": {"kernels": {"k": 1e-3}, "identical_output": True},
                 "nvvm": {"kernels": {}, "identical_output": True}}  # fmt: skip
    assert codegen.compare("saxpy", "n=8", one_sided)[0]["ratio"] is None


def test_the_table_shows_microseconds_the_ratio_and_the_choice() -> None:
    rows = codegen.compare("saxpy", "n=1024", {
        "llvm": {"kernels": {"tw_kernel_7": 12.5e-6}, "identical_output": True},
        "nvvm": {"kernels": {"tw_kernel_7": 10e-6}, "identical_output": False},
    })  # fmt: skip
    lines = codegen.table(rows).splitlines()
    assert lines[0].split() == ["program", "size", "kernel", "llvm", "us", "nvvm", "us", "llvm/nvvm", "output",
                                "choice"]  # fmt: skip
    assert lines[1].split() == ["saxpy", "n=1024", "tw_kernel_7", "12.5", "10.0", "1.25", "DIFFERS", "llvm"]


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys) -> None:
    from benchmarks import runner

    monkeypatch.setattr(runner, "pick_device", lambda requested: ("cpu", "no usable GPU: no driver"))
    assert codegen.main(["--programs", "saxpy"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (
        "benchmarks.codegen: no GPU (no usable GPU: no driver): it compares kernel times on the GPU"
    )
