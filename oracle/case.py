"""A generated test case: a module, the calls to make on it, and how to compare them.

Every generator produces a :class:`Case`; the comparator runs it on the reference and on a
backend under test; a failing case is saved as a regression, ``<name>.wat`` (the module)
next to ``<name>.json`` (the generator, the calls and the metadata), named by a hash of
both, and replayed by ``tests/test_regressions.py`` from then on.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime

from runtime.values import WasmValue, parse_json_value, to_json_value


@dataclass(frozen=True)
class Call:
    """One call of an exported function.

    ``exact`` says whether float results must match bit for bit. It is False where the
    result may be a NaN produced by arithmetic, whose payload Wasm leaves open: then any
    NaN matches any NaN.
    """

    func: str
    args: tuple[WasmValue, ...]
    exact: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"func": self.func, "args": [to_json_value(a) for a in self.args], "exact": self.exact}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Call:
        return cls(obj["func"], tuple(parse_json_value(a) for a in obj["args"]), obj.get("exact", True))


@dataclass
class Case:
    """A module (text, or binary when it has no text of our making) and its calls.

    ``meta`` is what a generator knows about the module beyond its text: for loop kernels
    the buffers' base addresses and sizes and the trip counts, so that a later offload mode
    can check the same kernels through the loop detector.
    """

    generator: str
    wat: str | None
    calls: list[Call]
    wasm_bytes: bytes | None = None
    meta: dict[str, Any] = field(default_factory=dict)

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
        return {
            "generator": self.generator,
            "calls": [c.to_json() for c in self.calls],
            "meta": self.meta,
        }

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
        return cls(obj["generator"], wat, [Call.from_json(c) for c in obj["calls"]], meta=obj.get("meta", {}))


def wasm_to_wat(wasm: bytes) -> str:
    """The text of a binary module, by ``wasm-tools print``."""
    done = subprocess.run(["wasm-tools", "print"], input=wasm, capture_output=True, check=True)
    return done.stdout.decode()
