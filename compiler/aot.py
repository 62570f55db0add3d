"""Ahead-of-time compilation: a module's GPU-compilable functions to PTX files and a manifest.

One PTX file per target holds a whole-function kernel (``tw_call_<index>``, the entry ABI
of :mod:`compiler.lower.abi`) for every function whose call closure stays inside the
module. ``manifest.json`` names each kernel with its Wasm signature, target, PTX ISA
version and the file's sha256, and each function left out with the reason.

With a code cache (the command line passes the runtime's in: the compiler imports no
runtime), each target's output, its PTX and its manifest rows, is an entry keyed by the
module's hash and the target: a second identical compile decodes, translates and lowers
nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tensorwasm.compiler import COMPILER_VERSION, pipeline
from tensorwasm.compiler.callgraph import reachable
from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.frontend import read_wasm
from tensorwasm.compiler.lower.function import MAX_OPTIMISED_LOOP_DEPTH, optimised
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, NVPTXTarget, describe
from tensorwasm.support.digest import sha256
from tensorwasm.support.records import replace

if TYPE_CHECKING:
    from collections.abc import Callable

# The code cache's kind for one target's output (its value: the JSON of :func:`_compile_for`).
CACHE_KIND = "aot"


class CodeCache(Protocol):
    """The code cache as ahead-of-time compilation uses it (``runtime.cache.Cache``)."""

    def get(self, kind: str, key: str) -> bytes | None: ...
    def put(self, kind: str, key: str, data: bytes) -> None: ...


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
    path: str | Path,
    out: Path,
    target: str | None = None,
    device: NVPTXTarget | None = None,
    cache: CodeCache | None = None,
    make_key: Callable[..., str] | None = None,
) -> dict:
    """Compile the module at ``path`` for the targets :func:`choose_targets` picks, into
    ``out``; returns the manifest it writes there. With a ``cache`` (and ``make_key``, which
    hashes a compilation's inputs with the compiler's identity), each target's output is
    read from it where an identical compile left it."""
    data = read_wasm(path)
    digest = sha256(data).hexdigest()
    request = pipeline.Request(data)
    outputs: dict[str, dict] = {}  # each target's, by its description
    state = None  # the module translated, at the first target the cache lacks
    for tgt in choose_targets(target, device):
        key = make_key(CACHE_KIND, digest, describe(tgt)) if cache is not None and make_key else None
        output = _cached(cache, key) if key is not None else None
        if output is None:
            if state is None:
                state = pipeline.run(request, "kernels")
            output = _compile_for(request, state, tgt)
            if key is not None:
                cache.put(CACHE_KIND, key, json.dumps(output).encode())
        outputs[tgt.arch] = output
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CompileError(f"cannot write to {out}: it exists and is not a directory") from None
    except OSError as exc:
        raise CompileError(f"cannot write to {out}: {exc.strerror}") from None
    stem = Path(path).stem
    manifest: dict = {
        "module": str(path),
        "module_sha256": digest,
        "compiler_version": COMPILER_VERSION,
        "targets": [],
        "kernels": [],
        "skipped": [],
    }
    for arch, output in outputs.items():
        manifest["skipped"] = output["skipped"]
        manifest["targets"].append(arch)
        if output["ptx"] is None:
            continue
        file = out / f"{stem}.{arch}.ptx"
        file.write_text(output["ptx"], encoding="ascii")
        manifest["kernels"].extend(
            {**row, "file": file.name, "sha256": output["sha256"]} for row in output["kernels"]
        )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _compile_for(request: pipeline.Request, state: pipeline.CompileState, tgt: NVPTXTarget) -> dict:
    """One target's output: its PTX (None where nothing compiles), its hash, a manifest row
    per kernel (less the file's name and hash) and the functions left out."""
    module = state.dialect.module
    skipped = []
    if state.kernels.functions:  # (a module of which nothing compiles has always listed none)
        skipped = [
            {"function": module.functions[i].name, "index": i, "reason": reason}
            for i, reason in sorted(state.kernels.skipped.items())
        ]
    ptx = pipeline.run(replace(request, target=tgt), state=replace(state)).ptx
    rows = []
    entries = sorted(ptx.entries.items()) if ptx.text is not None else []
    deep = {i for i in reachable(module, [i for i, _ in entries]) if not optimised(module.functions[i])}
    for index, entry in entries:
        func = module.functions[index]
        rows.append(
            {
                "function": func.name,
                "index": index,
                "exports": func.exports,
                "kernel": entry,
                "params": [t.name for t in func.params],
                "results": [t.name for t in func.results],
                "target": tgt.arch,
                "ptx_isa": tgt.ptx_isa,
                "optimisation": _optimisation(module, reachable(module, [index]), deep),
            }
        )
    return {"ptx": ptx.text, "sha256": ptx.sha256, "kernels": rows, "skipped": skipped}


def _optimisation(module, closure: list[int], deep: set[int]) -> str:
    """How a kernel's code was optimised: LLVM's -O2, except for functions whose loops
    nest too deep (lowered optnone), whose presence puts the PTX's code generation at
    level 0 for every kernel of the file."""
    if not deep:
        return "O2"
    mine = [module.functions[i] for i in closure if i in deep]
    if not mine:
        return "O2, code generation at level 0 (another kernel of the file nests loops too deep)"
    names = ", ".join(f"{f.name} ({f.loop_depth} deep)" for f in mine)
    return f"none: loops nested over {MAX_OPTIMISED_LOOP_DEPTH} deep in {names}; code generation at level 0"


def _cached(cache: CodeCache, key: str) -> dict | None:
    """A target's output as an earlier compile cached it; None where it has none (or one
    not of the expected shape)."""
    blob = cache.get(CACHE_KIND, key)
    if blob is None:
        return None
    try:
        output = json.loads(blob)
        if isinstance(output, dict) and {"ptx", "sha256", "kernels", "skipped"} <= output.keys():
            return output
    except ValueError:
        pass
    return None
