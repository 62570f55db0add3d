"""Wasm trap kinds: the codes compiled code writes into its trap slot, and their messages.

The codes are an ABI between the lowering (which stores them) and the runtime (which reads
them back): keep them stable. The messages are wasmtime's, so a trap on any backend reads
exactly as the reference's.
"""

from __future__ import annotations

import enum


class TrapKind(enum.IntEnum):
    UNREACHABLE = 1
    MEMORY_OUT_OF_BOUNDS = 2
    INTEGER_DIVIDE_BY_ZERO = 3
    INTEGER_OVERFLOW = 4
    BAD_CONVERSION_TO_INTEGER = 5
    TABLE_OUT_OF_BOUNDS = 6
    INDIRECT_CALL_TO_NULL = 7
    BAD_SIGNATURE = 8
    STACK_OVERFLOW = 9
    NULL_REFERENCE = 10  # call_ref or ref.as_non_null on null (typed function references)
    # Not a Wasm trap: a loop kernel read memory its loop writes; the runtime re-runs the
    # loop on the CPU, so the program never sees it.
    GATHER_CONFLICT = 100


TRAP_MESSAGES: dict[TrapKind, str] = {
    TrapKind.UNREACHABLE: "wasm `unreachable` instruction executed",
    TrapKind.MEMORY_OUT_OF_BOUNDS: "out of bounds memory access",
    TrapKind.INTEGER_DIVIDE_BY_ZERO: "integer divide by zero",
    TrapKind.INTEGER_OVERFLOW: "integer overflow",
    TrapKind.BAD_CONVERSION_TO_INTEGER: "invalid conversion to integer",
    TrapKind.TABLE_OUT_OF_BOUNDS: "undefined element: out of bounds table access",
    TrapKind.INDIRECT_CALL_TO_NULL: "uninitialized element",
    TrapKind.BAD_SIGNATURE: "indirect call type mismatch",
    TrapKind.STACK_OVERFLOW: "call stack exhausted",
    TrapKind.NULL_REFERENCE: "null reference",
    TrapKind.GATHER_CONFLICT: "a gathered load read memory the loop writes",
}


def trap_message(code: int) -> str:
    """The message of a trap code read back from a device or host run."""
    try:
        return TRAP_MESSAGES[TrapKind(code)]
    except ValueError:
        return f"unknown trap code {code}"
