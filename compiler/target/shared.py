"""Host code as a shared library: loaded by the dynamic linker, without LLVM.

Loading a host kernel's object code takes LLVM's JIT: importing llvmlite, making an
execution engine and relocating the code, ~20 to 40 ms of a process, most of it holding
Python's lock (which the program's arrivals then wait for). Where this machine has a
linker (``ld.lld``, ``ld`` or ``cc``), a compile also writes the kernel as a shared library:
its object code made again position-independent (the JIT's is not) and linked with
``-shared``. A later run loads that library with ``dlopen``, through a file of a fresh name
in the code cache's directory (the user's own, which nobody else may write in: nothing can
swap the file between the cache's check of the bytes and their load), removed once loaded:
well under a millisecond, and no LLVM in the process.

The kernels call nothing outside themselves (no libc, no libm: every operation is lowered
in line), so a library needs no other library; one whose link leaves a symbol undefined is
not made (:func:`link_shared` says why in the log), and the JIT loads its object code as
before. A machine without a linker (or one whose ``dlopen`` refuses the library) runs the
same code through the JIT.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
from typing import TYPE_CHECKING

from tensorwasm.support import logs

if TYPE_CHECKING:
    import llvmlite.binding as llvm

log = logs.get_logger(__name__)

# The linkers tried, in order: each as (program, arguments before the output).
LINKERS = (
    ("ld.lld", ("-shared", "--no-undefined", "-z", "now")),
    ("ld.lld-16", ("-shared", "--no-undefined", "-z", "now")),
    ("ld", ("-shared", "--no-undefined", "-z", "now")),
    ("cc", ("-shared", "-nostdlib", "-Wl,--no-undefined", "-Wl,-z,now")),
)


@functools.cache
def find_linker() -> tuple[str, tuple[str, ...]] | None:
    """The first linker on PATH (:data:`LINKERS`), with its arguments; None where none is."""
    import shutil  # (a compile's: a warm run loads libraries only)

    for program, arguments in LINKERS:
        found = shutil.which(program)
        if found:
            return found, arguments
    return None


def link_shared(module: llvm.ModuleRef, target_machine: llvm.TargetMachine) -> bytes | None:
    """``module`` (optimised) as a shared library: its object code by ``target_machine``
    (position-independent), linked by :func:`find_linker`'s linker; None where there is no
    linker or the link fails (logged: the JIT loads the kernel instead)."""
    import subprocess
    import tempfile

    linker = find_linker()
    if linker is None:
        return None
    program, arguments = linker
    obj = target_machine.emit_object(module)
    with tempfile.TemporaryDirectory(prefix="tensorwasm-link-") as work:
        source, out = os.path.join(work, "kernel.o"), os.path.join(work, "kernel.so")
        with open(source, "wb") as f:
            f.write(obj)
        try:
            done = subprocess.run(
                [program, *arguments, "-o", out, source], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("no shared library for host code: %s failed: %s", program, exc)
            return None
        if done.returncode != 0:
            log.info("no shared library for host code: %s: %s", program, done.stderr.strip()[:500])
            return None
        with open(out, "rb") as f:
            return f.read()


class SharedCode:
    """Host code loaded from a shared library's bytes (see the module's doc), kept alive as
    long as its functions may be called."""

    _loaded = itertools.count()

    def __init__(self, library: bytes, directory: str, prefix: str = "") -> None:
        """Load ``library`` through a file of a name never used before in ``directory`` (one
        of this user's own, that nobody else may write in), removed once loaded: the dynamic
        linker knows a library by its name, and would take a name used before for the
        library loaded under it. ``prefix`` begins the file's name (what marks a file the
        directory's owner may remove if a process died before it did)."""
        os.makedirs(directory, mode=0o700, exist_ok=True)
        name = f"{prefix}kernel-{os.getpid()}-{next(self._loaded)}-{os.urandom(6).hex()}.so"
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o500)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(library)
            self._lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        finally:
            os.unlink(path)  # (the mapping stays)

    def address(self, name: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value or 0
        except AttributeError:
            from tensorwasm.compiler.errors import CompileError

            raise CompileError(f"no function {name} in the shared library") from None


def load_shared(library: bytes, directory: str, prefix: str = "") -> SharedCode | None:
    """The library's code loaded (through ``directory``: see :class:`SharedCode`), or None
    where this system cannot (the dynamic linker refuses it, or the directory is mounted
    without the right to run code: logged, and the JIT loads the object code instead)."""
    try:
        return SharedCode(library, directory, prefix)
    except OSError as exc:
        log.info("a host kernel's shared library did not load: %s", exc)
        return None
