"""PTX to a cubin with ptxas, in a process of its own, before the driver sees it.

The driver's JIT compiles PTX inside the calling process. Where NVIDIA's assembler crashes
on a module (ptxas 13.0 dies of a segmentation fault on some recursive functions that take
the f64 square root of values it folds), the process dies with it, the user's program and
data too; a guest that ships its own PTX (:mod:`runtime.wasi_cuda`) could bring one down on
purpose. So where a ptxas is found (``TENSORWASM_PTXAS``, else ``PATH``, else the pip package
``nvidia-cuda-nvcc``) and it is no newer than the driver, a module is assembled in a child
process and the driver loads the cubin it wrote: a crash there is an error that names the
cause and keeps the module on disk with the command that reproduces it. Where ptxas cannot
read a module (a syntax error, a PTX ISA newer than it knows) the driver's JIT takes it and
reports what it finds. ``TENSORWASM_PTXAS=off`` leaves every module to the driver.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from tensorwasm.support import config, logs

log = logs.get_logger(__name__)

TIMEOUT_SECONDS = 300  # a module the assembler has not finished by then is refused


class AssemblerCrash(Exception):
    """ptxas died on a module (a signal, or no answer in time): ``detail`` says how, and
    ``kept`` is the module's path on disk."""

    def __init__(self, detail: str, kept: Path) -> None:
        self.detail, self.kept = detail, kept
        super().__init__(detail)


@functools.cache
def _ptxas(setting: str | Literal[False] | None) -> tuple[str, tuple[int, int]] | None:
    if setting is False:
        return None
    if setting:
        path = setting
    else:
        from tensorwasm.compiler.target import find_ptxas

        path = find_ptxas()
        if path is None:
            return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("no usable ptxas at %s (%s): the driver's JIT compiles PTX", path, exc)
        return None
    found = re.search(r"release (\d+)\.(\d+)", done.stdout)
    if done.returncode != 0 or found is None:
        log.info("no usable ptxas at %s: the driver's JIT compiles PTX", path)
        return None
    return path, (int(found.group(1)), int(found.group(2)))


def ptxas() -> tuple[str, tuple[int, int]] | None:
    """The ptxas used, with its CUDA release; None where none is found (or it is turned off)."""
    return _ptxas(config.ptxas())


def assemble(ptx: bytes, arch: str, driver_version: int) -> bytes | None:
    """The cubin of ``ptx`` for ``arch`` from ptxas in a child process; None where the driver's
    JIT is to compile it instead (no ptxas, one newer than the driver ``driver_version``, e.g.
    13000 for CUDA 13.0, whose cubins it may not load, or a module ptxas refuses). Raises
    :class:`AssemblerCrash` where ptxas crashes on it."""
    found = ptxas()
    if found is None:
        return None
    path, release = found
    if release > divmod(driver_version // 10, 100):
        return None
    text = ptx.rstrip(b"\0")
    with tempfile.TemporaryDirectory(prefix="tensorwasm-ptxas-") as tmp:
        source, cubin = Path(tmp) / "module.ptx", Path(tmp) / "module.cubin"
        source.write_bytes(text)
        try:
            done = subprocess.run(
                [path, f"-arch={arch}", str(source), "-o", str(cubin)],
                capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise AssemblerCrash(f"ptxas did not finish in {TIMEOUT_SECONDS} s", _keep(text)) from None
        except OSError as exc:
            log.info("ptxas could not run (%s): the driver's JIT compiles the module", exc)
            return None
        died = _signal(done.returncode)
        if died is not None:
            detail = f"ptxas {release[0]}.{release[1]} crashed ({died}) on the module"
            if done.stderr.strip():
                detail += f": {done.stderr.strip()}"
            raise AssemblerCrash(detail, _keep(text))
        if done.returncode != 0:
            log.info("ptxas refused the module, the driver's JIT takes it: %s", done.stderr.strip()[:500])
            return None
        return cubin.read_bytes()


# Signals that end a crashed program; a shell that runs ptxas without exec reports one as
# 128 + its number.
_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT, signal.SIGFPE, signal.SIGKILL)


def _signal(status: int) -> str | None:
    """The name of the signal that ended a process with exit ``status``, if one did."""
    number = -status if status < 0 else status - 128
    if number not in _CRASHES:  # (an interrupted or terminated ptxas did not crash)
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _keep(text: bytes) -> Path:
    """The module written where it outlives the process, for the reproducing command."""
    fd, name = tempfile.mkstemp(prefix="tensorwasm-crash-", suffix=".ptx")
    with os.fdopen(fd, "wb") as out:
        out.write(text)
    return Path(name)
