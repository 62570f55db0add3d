"""``scripts/ncu-summary``: every kernel that took at least a tenth of a program's device
time gets a line, heaviest first (a set-up loop may outweigh the compute kernel)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HEADER = (
    '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum.per_second","launch__registers_per_thread"'
)
UNITS = '"","","ns","byte/second","register/thread"'


def _csv(launches: list[tuple[str, int, int]]) -> str:
    lines = ["==PROF== Connected to process", HEADER, UNITS]
    lines += [f'"{i}","{name}","{ns}","1e9","{regs}"' for i, (name, ns, regs) in enumerate(launches)]
    return "\n".join(lines) + "\n"


def test_each_kernel_with_a_tenth_of_the_time_gets_a_line_heaviest_first(tmp_path) -> None:
    (tmp_path / "tensorwasm-saxpy.csv").write_text(
        _csv(
            [
                ("tw_kernel_0", 600, 16),
                ("tw_kernel_3", 200, 24),
                ("tw_kernel_3", 250, 24),
                ("tw_kernel_7", 50, 8),
            ]
        )
    )
    (tmp_path / "nvcc-saxpy.csv").write_text(_csv([("saxpy", 400, 12)]))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/ncu-summary"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("saxpy |")]
    kernels = [line.split(" | ")[1:4] for line in lines]
    assert kernels[:2] == [
        ["tensorwasm", "tw_kernel_0", "1"],
        ["tensorwasm", "tw_kernel_3", "2"],  # 450 of 1100 ns: shown, with both launches
    ]
    assert kernels[2][:2] == ["nvvm", "no profile ()"]  # no CSV for libNVVM's build
    assert kernels[3] == ["nvcc", "saxpy", "1"]
    assert "tw_kernel_7" not in done.stdout  # 50 of 1100 ns: under a tenth
    assert lines[1].split(" | ")[4] == "0.5"  # its total, in microseconds
