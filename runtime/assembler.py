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
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from tensorwasm.compiler.rewrite import read_uleb
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


# -- stack frames ----------------------------------------------------------------------------
#
# Recursion on the GPU runs on a per-thread stack whose size the runtime sets
# (runtime.executor), so it needs each function's stack frame. ptxas writes them into the
# cubin (the driver's JIT too) as the call frame information of .debug_frame: per function, a
# DWARF frame description whose CFA offset is the frame's size ("N bytes stack frame" of
# ptxas -v). Reading the cubin serves a cached cubin as well as a fresh one, with no second
# run of ptxas (which takes minutes on a function of a thousand live locals).

_DW_CFA_ADVANCE, _DW_CFA_OFFSET, _DW_CFA_RESTORE = 0x40, 0x80, 0xC0
# The operands of each extended call-frame instruction: u (ULEB128), s (SLEB128), b (a ULEB128
# length and that many bytes), 1/2/4/8 (fixed bytes).
_CFA_OPERANDS = {
    0x00: "", 0x01: "8", 0x02: "1", 0x03: "2", 0x04: "4", 0x05: "uu", 0x06: "u", 0x07: "u",
    0x08: "u", 0x09: "uu", 0x0A: "", 0x0B: "", 0x0C: "uu", 0x0D: "u", 0x0E: "u", 0x0F: "b",
    0x10: "ub", 0x11: "us", 0x12: "us", 0x13: "s", 0x14: "uu", 0x15: "us", 0x16: "ub",
}  # fmt: skip
_DEF_CFA, _DEF_CFA_OFFSET, _DEF_CFA_SF, _DEF_CFA_OFFSET_SF = 0x0C, 0x0E, 0x12, 0x13


def stack_frames(cubin: bytes) -> list[int] | None:
    """The stack frame of every function in ``cubin`` (entries included), in bytes: the
    largest CFA offset of each frame description in its .debug_frame. None where the image
    holds no frame information that this reads (no such section, or an instruction it does
    not know): the caller then estimates (:func:`ptx_frame_bounds`)."""
    try:
        section = _elf_section(cubin, ".debug_frame")
        if section is None:
            return None
        return _cfa_frames(section)
    except (IndexError, KeyError, ValueError, struct.error):
        return None


def _elf_section(image: bytes, wanted: str) -> bytes | None:
    """The contents of section ``wanted`` of a 64-bit little-endian ELF image."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", image, shoff + i * entsize) for i in range(count)]
    names_at = headers[names][4]
    for name, _, _, _, offset, size in headers:
        end = image.index(b"\0", names_at + name)
        if image[names_at + name : end].decode("ascii", "replace") == wanted:
            return image[offset : offset + size]
    return None


def _sleb(data: bytes, at: int) -> tuple[int, int]:
    start = at
    value, at = read_uleb(data, at)
    bits = 7 * (at - start)
    return (value - (1 << bits) if value >> (bits - 1) & 1 else value), at


def _cfa_frames(section: bytes) -> list[int]:
    """The largest CFA offset of each FDE (64- or 32-bit DWARF, as ptxas writes them)."""
    frames, data_align, at = [], 1, 0
    while at < len(section):
        (length,) = struct.unpack_from("<I", section, at)
        wide = length == 0xFFFFFFFF
        if wide:
            (length,) = struct.unpack_from("<Q", section, at + 4)
            at += 12
        else:
            at += 4
        end = at + length
        id_size = 8 if wide else 4
        cie_id = int.from_bytes(section[at : at + id_size], "little")
        if cie_id == (1 << 8 * id_size) - 1:  # a CIE: version, augmentation, alignments
            p = section.index(b"\0", at + id_size + 1) + 1
            _, p = read_uleb(section, p)
            data_align, p = _sleb(section, p)
        else:  # an FDE: CIE pointer, initial location and range (8-byte addresses)
            frames.append(_largest_cfa(section[at + id_size + 16 : end], data_align))
        at = end
    return frames


def _largest_cfa(program: bytes, data_align: int) -> int:
    largest, at = 0, 0
    while at < len(program):
        op = program[at]
        at += 1
        if op & 0xC0 == _DW_CFA_OFFSET:
            _, at = read_uleb(program, at)
            continue
        if op & 0xC0 in (_DW_CFA_ADVANCE, _DW_CFA_RESTORE):
            continue
        operands = []
        for kind in _CFA_OPERANDS[op]:
            if kind == "u":
                value, at = read_uleb(program, at)
            elif kind == "s":
                value, at = _sleb(program, at)
            elif kind == "b":
                value, at = read_uleb(program, at)
                at += value
            else:
                value, at = int.from_bytes(program[at : at + int(kind)], "little"), at + int(kind)
            operands.append(value)
        if op in (_DEF_CFA, _DEF_CFA_OFFSET):
            largest = max(largest, operands[-1])
        elif op in (_DEF_CFA_SF, _DEF_CFA_OFFSET_SF):
            largest = max(largest, operands[-1] * data_align)
    return largest


_PTX_FUNCTION = re.compile(rb"^(?:\.visible\s+|\.extern\s+|\.weak\s+)*\.(?:entry|func)\b", re.M)
_PTX_REGISTERS = re.compile(rb"\.reg\s+\.\w+\s+%\w+<(\d+)>")
_PTX_PARAMS = re.compile(rb"\.param\s+\.(?:b|u|s|f)(\d+)\s+\w+(?:\[(\d+)\])?")
_PTX_DEPOT = re.compile(rb"\.local\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]")
FRAME_BOUND_EXTRA = 64  # return address and alignment


def ptx_frame_bounds(ptx: bytes) -> list[int]:
    """An upper bound of each function's stack frame in ``ptx``, where the cubin tells none:
    its local depot, every virtual register spilled (8 bytes each) and every parameter it
    declares, plus :data:`FRAME_BOUND_EXTRA`. ptxas needs far less (a frame holds only the
    registers live across a call), so the depth this allows is lower, never unsafe."""
    starts = [m.start() for m in _PTX_FUNCTION.finditer(ptx)]
    bounds = []
    for start, end in zip(starts, [*starts[1:], len(ptx)], strict=True):
        text = ptx[start:end]
        registers = sum(int(n) for n in _PTX_REGISTERS.findall(text))
        params = sum(int(bits) // 8 * int(count or 1) for bits, count in _PTX_PARAMS.findall(text))
        depot = sum(int(n) for n in _PTX_DEPOT.findall(text))
        bounds.append(depot + 8 * registers + params + FRAME_BOUND_EXTRA)
    return bounds
