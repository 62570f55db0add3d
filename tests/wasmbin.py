"""Tiny helpers that assemble Wasm binaries byte by byte, for tests of malformed input."""

from __future__ import annotations

from tensorwasm.compiler.rewrite import section, uleb, vec

__all__ = ["section", "uleb", "vec"]


HEADER = b"\0asm\x01\0\0\0"
# (type 0 (func)) / one function of type 0
TYPE_SECTION = section(1, vec([b"\x60\x00\x00"]))
FUNC_SECTION = section(3, vec([b"\x00"]))


def body(code: bytes, locals_: bytes = b"\x00") -> bytes:
    """One function body entry: size, local declarations, code (code must end in 0x0b)."""
    content = locals_ + code
    return uleb(len(content)) + content


def module_with_body(code: bytes) -> bytes:
    """A module of one ``() -> ()`` function whose body is ``code``."""
    return HEADER + TYPE_SECTION + FUNC_SECTION + section(10, vec([body(code)]))
