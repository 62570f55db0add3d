"""docs/opcodes.md is generated from the code and must be current."""

from __future__ import annotations

from tensorwasm.compiler.frontend.docs import DOC_PATH, render
from tensorwasm.compiler.frontend.opcodes import OPCODES


def test_opcode_doc_is_current() -> None:
    assert DOC_PATH.read_text() == render(), "run: python -m tensorwasm.compiler.frontend.docs"


def test_opcode_doc_lists_every_row() -> None:
    text = render()
    for op in OPCODES:
        assert f"| `{op.name}` |" in text
