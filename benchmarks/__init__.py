"""Benchmarks: the suite against its peers, the example programs, and the runtime's costs."""

from __future__ import annotations

import compileall
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    """Write the project's bytecode before timing fresh processes: an installed package has
    it (pip compiles at install), but a checkout run with PYTHONDONTWRITEBYTECODE set would
    compile every module from source in every process."""
    for package in ("tensorwasm", "compiler", "dialect", "runtime", "oracle"):
        compileall.compile_dir(ROOT / package, quiet=1)


def first_line(args: list[str]) -> str | None:
    """The first line of a tool's output (run in the checkout), or None where it is missing
    or fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def source_commit() -> str | None:
    """The commit the measured tree is: ``TENSORWASM_COMMIT`` where set (a copy of the tree
    without its history), else HEAD's short hash with ``-dirty`` after it where tracked files
    differ from HEAD (a copy whose history is not its files', or uncommitted changes: its
    numbers are not that commit's); None without git."""
    return os.environ.get("TENSORWASM_COMMIT") or first_line(
        ["git", "describe", "--always", "--dirty", "--abbrev=12"]
    )
