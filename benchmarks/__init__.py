"""Benchmarks: the suite against its peers, the example programs, and the runtime's costs."""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    """Write the project's bytecode before timing fresh processes: an installed package has
    it (pip compiles at install), but a checkout run with PYTHONDONTWRITEBYTECODE set would
    compile every module from source in every process."""
    for package in ("tensorwasm", "compiler", "dialect", "runtime", "oracle"):
        compileall.compile_dir(ROOT / package, quiet=1)
