"""The compiler's stages, by name, each one printable (``inspect --stage ...``).

``wasm`` (decoded module) -> ``dialect`` (translated, verified) -> ``llvm`` (lowered IR)
-> ``ptx`` (NVPTX) or native code (host). :func:`compile_entries` runs the back half for a
set of functions: those whose call closure reaches a host import are left out with the
reason, the rest share one LLVM module.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from tensorwasm.compiler.callgraph import reachable
from tensorwasm.compiler.errors import NotCompilable
from tensorwasm.compiler.frontend.module import WasmModule
from tensorwasm.compiler.lower.abi import entry_name
from tensorwasm.compiler.lower.function import LowerOptions, ModuleLowering
from tensorwasm.compiler.target import NVPTXTarget, Target
from tensorwasm.dialect.ir import Module

from tensorwasm.support import logs

log = logs.get_logger(__name__)

STAGES = ("wasm", "dialect", "llvm", "ptx")


@dataclass
class Compilation:
    """The result of compiling some functions of a module for one target."""

    target: Target
    llvm_ir: str
    entries: dict[int, str]  # function index -> entry symbol
    skipped: dict[int, str] = field(default_factory=dict)  # function index -> reason
    ptx: str | None = None
    seconds: float = 0.0
    obj: bytes | None = None  # host object code, when it came from a cache
    cached: bool = False

    @property
    def ptx_sha256(self) -> str | None:
        return hashlib.sha256(self.ptx.encode()).hexdigest() if self.ptx is not None else None


def compilable(module: Module, indices) -> tuple[list[int], dict[int, str]]:
    """Split ``indices`` into functions the compiler can take and those it cannot (why)."""
    ok, skipped = [], {}
    for index in indices:
        func = module.functions[index]
        if func.is_import:
            skipped[index] = f"{func.name} is a host import ({func.import_name[0]}.{func.import_name[1]})"
            continue
        try:
            reachable(module, [index])
        except NotCompilable as exc:
            skipped[index] = f"{func.name} {exc}"
            continue
        ok.append(index)
    return ok, skipped


def lower(
    module: Module, target: Target, indices, options: LowerOptions | None = None
) -> tuple[str, dict, dict]:
    ok, skipped = compilable(module, indices)
    lowering = ModuleLowering(module, target, options)
    names = lowering.lower_entries(ok)
    return str(lowering.llvm), dict(zip(ok, names, strict=True)), skipped


def compile_entries(
    module: Module,
    target: Target,
    indices,
    options: LowerOptions | None = None,
    cache=None,
    key: str | None = None,
) -> Compilation:
    """Lower the given functions' entry points and, for NVPTX, generate the PTX. With a
    ``cache`` and ``key``, a cached PTX (or host object code) skips lowering altogether."""
    start = time.perf_counter()
    if cache is not None and key is not None:
        kind = "ptx" if isinstance(target, NVPTXTarget) else "obj"
        hit = cache.get(kind, key)
        if hit is not None:
            ok, skipped = compilable(module, indices)
            entries = {i: entry_name(i) for i in ok}
            ptx = hit.decode("ascii") if kind == "ptx" else None
            return Compilation(target, "", entries, skipped, ptx, time.perf_counter() - start,
                               None if ptx else hit, cached=True)  # fmt: skip
    llvm_ir, entries, skipped = lower(module, target, indices, options)
    ptx = target.emit_ptx(llvm_ir) if isinstance(target, NVPTXTarget) and entries else None
    if ptx is not None and cache is not None and key is not None:
        cache.put("ptx", key, ptx.encode("ascii"))
    seconds = time.perf_counter() - start
    log.info("compiled %d functions for %s in %.1f ms", len(entries), target.name, seconds * 1e3)
    return Compilation(target, llvm_ir, entries, skipped, ptx, seconds)


def exported_functions(wasm: WasmModule) -> list[int]:
    seen: list[int] = []
    for export in wasm.exports:
        if export.kind == "func" and export.index not in seen:
            seen.append(export.index)
    return seen
