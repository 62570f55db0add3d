"""Ahead-of-time compilation: a module's GPU-compilable functions to PTX files and a manifest.

One PTX file per target holds a whole-function kernel (``tw_call_<index>``, the entry ABI
of :mod:`compiler.lower.abi`) for every function whose call closure stays inside the
module. ``manifest.json`` names each kernel with its Wasm signature, target, PTX ISA
version and the file's sha256, and each function left out with the reason.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tensorwasm.compiler import COMPILER_VERSION
from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.frontend import load, read_wasm, translate_module
from tensorwasm.compiler.pipeline import compile_entries
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, NVPTXTarget


def choose_targets(name: str | None) -> list[NVPTXTarget]:
    if name == "all" or (name is None and not _gpu_target()):
        return [NVPTXTarget(arch, ARCH_PTX[arch]) for arch in ARCHES]
    if name is None:
        return [_gpu_target()]
    if name not in ARCHES:
        raise CompileError(f"unknown target {name!r}: choose sm_75, sm_80, sm_90 or all")
    return [NVPTXTarget(name, ARCH_PTX[name])]


def _gpu_target() -> NVPTXTarget | None:
    from tensorwasm.compiler.target import nvptx_for_device
    from tensorwasm.runtime import driver  # optional: AOT works without a GPU or a driver

    found = driver.devices() if driver.driver_available() else []
    if not found:
        return None
    return nvptx_for_device(found[0].compute_capability, found[0].driver_version)


def compile_to_directory(path: str | Path, out: Path, target: str | None = None) -> dict:
    data = read_wasm(path)
    wasm = load(data)
    module = translate_module(wasm)
    indices = list(range(wasm.num_imported_funcs, wasm.num_funcs))
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(path).stem
    manifest: dict = {
        "module": str(path),
        "module_sha256": hashlib.sha256(data).hexdigest(),
        "compiler_version": COMPILER_VERSION,
        "targets": [],
        "kernels": [],
        "skipped": [],
    }
    for tgt in choose_targets(target):
        compilation = compile_entries(module, tgt, indices)
        manifest["targets"].append(tgt.arch)
        if compilation.ptx is None:
            continue
        file = out / f"{stem}.{tgt.arch}.ptx"
        file.write_text(compilation.ptx, encoding="ascii")
        for index, entry in sorted(compilation.entries.items()):
            func = module.functions[index]
            manifest["kernels"].append(
                {
                    "function": func.name,
                    "index": index,
                    "exports": func.exports,
                    "kernel": entry,
                    "params": [t.name for t in func.params],
                    "results": [t.name for t in func.results],
                    "target": tgt.arch,
                    "ptx_isa": tgt.ptx_isa,
                    "file": file.name,
                    "sha256": compilation.ptx_sha256,
                }
            )
        if not manifest["skipped"]:
            manifest["skipped"] = [
                {"function": module.functions[i].name, "index": i, "reason": reason}
                for i, reason in sorted(compilation.skipped.items())
            ]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
