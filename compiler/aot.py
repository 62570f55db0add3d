"""Ahead-of-time compilation: a module's GPU-compilable functions to PTX files and a manifest.

One PTX file per target holds a whole-function kernel (``tw_call_<index>``, the entry ABI
of :mod:`compiler.lower.abi`) for every function whose call closure stays inside the
module. ``manifest.json`` names each kernel with its Wasm signature, target, PTX ISA
version and the file's sha256, and each function left out with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from tensorwasm.compiler import COMPILER_VERSION, pipeline
from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.frontend import read_wasm
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, NVPTXTarget
from tensorwasm.support.digest import sha256
from tensorwasm.support.records import replace


def choose_targets(name: str | None, device: NVPTXTarget | None = None) -> list[NVPTXTarget]:
    """The targets ``--target name`` asks for; without a name, ``device`` (the GPU's
    target, which the caller finds) or, where there is none, every architecture."""
    if name == "all" or (name is None and device is None):
        return [NVPTXTarget(arch, ARCH_PTX[arch]) for arch in ARCHES]
    if name is None:
        return [device]
    if name not in ARCHES:
        raise CompileError(f"unknown target {name!r}: choose sm_75, sm_80, sm_90 or all")
    return [NVPTXTarget(name, ARCH_PTX[name])]


def compile_to_directory(
    path: str | Path, out: Path, target: str | None = None, device: NVPTXTarget | None = None
) -> dict:
    """Compile the module at ``path`` for the targets :func:`choose_targets` picks, into
    ``out``; returns the manifest it writes there."""
    data = read_wasm(path)
    request = pipeline.Request(data)
    state = pipeline.run(request, "kernels")
    module = state.dialect.module
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CompileError(f"cannot write to {out}: it exists and is not a directory") from None
    except OSError as exc:
        raise CompileError(f"cannot write to {out}: {exc.strerror}") from None
    stem = Path(path).stem
    manifest: dict = {
        "module": str(path),
        "module_sha256": sha256(data).hexdigest(),
        "compiler_version": COMPILER_VERSION,
        "targets": [],
        "kernels": [],
        "skipped": [],
    }
    if state.kernels.functions:  # (a module of which nothing compiles has always listed none)
        manifest["skipped"] = [
            {"function": module.functions[i].name, "index": i, "reason": reason}
            for i, reason in sorted(state.kernels.skipped.items())
        ]
    for tgt in choose_targets(target, device):
        ptx = pipeline.run(replace(request, target=tgt), state=replace(state)).ptx
        manifest["targets"].append(tgt.arch)
        if ptx.text is None:
            continue
        file = out / f"{stem}.{tgt.arch}.ptx"
        file.write_text(ptx.text, encoding="ascii")
        for index, entry in sorted(ptx.entries.items()):
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
                    "sha256": ptx.sha256,
                }
            )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
