"""The frontend: Wasm bytes (or text) in, a validated module and its dialect out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tensorwasm.compiler.errors import DecodeError, ValidationError
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule

if TYPE_CHECKING:
    import wasmtime

    from tensorwasm.compiler.frontend.module import WasmModule
else:
    # (``tensorwasm run`` reads its module, and begins the GPU's start, before wasmtime loads)
    wasmtime = LazyModule("wasmtime", globals(), "wasmtime")

# The decoder and the translation load at first use: a warm start, whose analysis comes
# from the cache, imports only the module classes its plans refer to.
_LAZY = {
    "decode": "tensorwasm.compiler.frontend.decoder",
    "WasmModule": "tensorwasm.compiler.frontend.module",
    "translate_function": "tensorwasm.compiler.frontend.translate",
    "translate_module": "tensorwasm.compiler.frontend.translate",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["decode", "load", "read_wasm", "translate_function", "translate_module", "validate"]


# The largest module file read: wasmtime refuses far smaller code sections, and a stream
# that never ends (``/dev/zero`` behind a valid header) must not take all memory.
MAX_MODULE_BYTES = 1 << 30


def read_module_file(path: str | Path) -> bytes:
    """A module file's bytes, read once (it may be a pipe). What starts neither as a binary
    module nor as text is refused after its first bytes, not read to its end."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            head = stream.read(8)
            text = path.suffix == ".wat" or head.lstrip()[:1] in (b"(", b";")
            if head[:4] != b"\0asm" and not text:
                raise DecodeError(f"{path}: not a WebAssembly module (it starts with {head[:4].hex(' ')})")
            rest = stream.read(MAX_MODULE_BYTES + 1 - len(head))
    except OSError as exc:
        raise DecodeError(f"cannot read {path}: {exc.strerror}") from None
    if len(head) + len(rest) > MAX_MODULE_BYTES:
        raise DecodeError(f"{path}: larger than {MAX_MODULE_BYTES >> 20} MiB, the most a module may be")
    return head + rest


def read_wasm(path: str | Path) -> bytes:
    """The bytes of a ``.wasm`` file, or of a ``.wat`` file assembled to binary."""
    return wasm_of(read_module_file(path), path)


def wasm_of(data: bytes, path: str | Path) -> bytes:
    """``data`` (read from ``path``) as binary: assembled where it is WebAssembly text."""
    path = Path(path)
    if path.suffix == ".wat" or (data[:4] != b"\0asm" and data.lstrip()[:1] == b"("):
        try:
            return bytes(wasmtime.wat2wasm(data.decode("utf-8")))
        except (wasmtime.WasmtimeError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DecodeError(f"{path}: not valid WebAssembly text: {first}") from None
    return data


_ENGINE: wasmtime.Engine | None = None


def validate(data: bytes) -> None:
    """Validate with wasmtime's validator; raises ValidationError with its message."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = wasmtime.Engine()
    try:
        wasmtime.Module.validate(_ENGINE, data)
    except wasmtime.WasmtimeError as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise ValidationError("invalid module: " + "; ".join(lines[:3])) from None


def load(data: bytes, *, degrade: bool = False) -> WasmModule:
    """Decode and validate: the module every later stage may rely on.

    wasmtime validates the module before any function body is decoded (bodies are decoded
    at first use), so hostile input costs memory in proportion to its size; where either
    refuses the module, the first problem in the order of the bytes is raised, as a
    decoder's error where the decoder finds one. Without ``degrade`` every body is decoded
    here and the first use of a proposal TensorWasm does not compile is raised
    (UnsupportedFeature); with it, such uses are marked on the module and its functions
    instead (see :mod:`compiler.frontend.decoder`), for a caller that runs the module on
    wasmtime anyway."""
    from tensorwasm.compiler.frontend.decoder import check, decode

    data = bytes(data)
    try:
        module = decode(data, lazy=True, degrade=degrade)
        validate(data)
    except TensorWasmError:
        check(data, degrade)  # a decoder's error, with its offset, comes first
        raise
    if not degrade:
        for code in module.codes:
            code.load()
    return module
