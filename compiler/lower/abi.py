"""The layout shared by compiled code and the runtime that calls it.

Compiled code sees an instance through one context block of 64-bit slots (``CTX_*``
below); the runtime fills it on the host or on the device. Globals are 64-bit slots
holding bit patterns (an i32 or f32 in the low half); a v128 global keeps its low half in
its own slot and its high half in a slot after all the globals' (:func:`global_slot_values`).
Tables are descriptors of four
slots (entries pointer, size, capacity, maximum) and their entries are 64-bit slots:
0 is null, a function reference is its index + 1. Data and element segments are
descriptors of two slots (pointer, length); dropping a segment sets its length to 0.

A whole-function entry point ``tw_call_<index>(ctx, io)`` reads the arguments from
``io[1..]``, writes the results to ``io[1..]`` and the trap code (0 for none) to ``io[0]``;
a v128 takes two slots there, low half first (:func:`value_slots`).

The runtime keeps the context block, and the parameter and result blocks of a loop
kernel, apart from each other and from everything the code reaches through them (linear
memory, globals, tables, segments): the lowering marks pointers to them ``noalias``.

A loop kernel's live-ins are 64-bit slots, one each (:func:`param_words`). On the GPU it
takes them by value, as one kernel parameter of that many words (:func:`params_by_value`):
the launch's constant bank holds them, so a thread reads them without a load from device
memory before its first access (and ptxas uses them as operands, in no register). Beyond
:data:`PARAM_WORDS_BY_VALUE` words, and on the host, it takes a pointer to them.
"""

from __future__ import annotations

import ctypes

CTX_MEM_BASE = 0
CTX_MEM_SIZE = 1  # bytes
CTX_MEM_CAPACITY = 2  # bytes reserved: memory.grow fails beyond this
CTX_MEM_MAX_PAGES = 3  # the declared maximum, or 65536
CTX_GLOBALS = 4
CTX_TABLES = 5
CTX_TRAP = 6
CTX_DEPTH = 7  # call depth, for the stack-exhaustion trap
CTX_DATA = 8
CTX_ELEMS = 9
# Loop kernels with gathered loads: byte ranges [lo, hi) the loop writes, as pairs of slots;
# a gathered load inside one of them stops the kernel with GATHER_CONFLICT.
CTX_WRITTEN = 10
CTX_WRITTEN_COUNT = 11
# The call depth at which recursion traps, set by the executor from the stack it sized (one
# compilation serves any stack); 0: the default compiled in (LowerOptions.max_call_depth).
CTX_DEPTH_LIMIT = 12
# Host code only: the lowest native stack address a recursive call may start below; 0: none.
CTX_STACK_FLOOR = 13
CTX_SLOTS = 14

TABLE_PTR, TABLE_SIZE, TABLE_CAPACITY, TABLE_MAX = 0, 1, 2, 3
TABLE_SLOTS = 4
SEGMENT_PTR, SEGMENT_LEN = 0, 1
SEGMENT_SLOTS = 2

PAGE_SIZE = 65536
IO_TRAP = 0
IO_VALUES = 1

ContextBlock = ctypes.c_uint64 * CTX_SLOTS
MASK64 = (1 << 64) - 1


def value_slots(type_name: str) -> int:
    """How many 64-bit ``io`` slots a value of the named type takes."""
    return 2 if type_name == "v128" else 1


def high_half_slot(type_names: list[str], index: int) -> int:
    """The slot of the high half of v128 global ``index`` (globals' types by name, in order)."""
    return len(type_names) + sum(1 for name in type_names[:index] if name == "v128")


def global_slot_values(type_names: list[str], values: list[int]) -> list[int]:
    """The globals' slots from their bit patterns: one each, then the v128s' high halves."""
    slots = [value & MASK64 for value in values]
    slots += [value >> 64 for name, value in zip(type_names, values, strict=True) if name == "v128"]
    return slots


def global_values(type_names: list[str], slots: list[int]) -> list[int]:
    """The globals' bit patterns read back from their slots (see :func:`global_slot_values`)."""
    values = list(slots[: len(type_names)])
    for i, name in enumerate(type_names):
        if name == "v128":
            values[i] |= slots[high_half_slot(type_names, i)] << 64
    return values


def context_block(
    *,
    memory_base: int = 0,
    memory_size: int = 0,
    memory_capacity: int = 0,
    max_pages: int = 0,
    globals_at: int = 0,
    tables_at: int = 0,
    data_at: int = 0,
    elems_at: int = 0,
    written_at: int = 0,
    written_count: int = 0,
    depth_limit: int = 0,
    stack_floor: int = 0,
) -> ctypes.Array:
    """The context block an executor hands compiled code, from named fields (the one writer
    of its slots): linear memory's base address, size and capacity in bytes and its maximum
    in pages; where the globals, the table descriptors and the data and element segment
    descriptors are; the loop kernels' written ranges and their count; the call depth at which
    recursion traps and, on the host, the native stack floor. The trap and call depth slots
    start at 0. Fields an executor lacks stay 0."""
    block = ContextBlock()
    block[CTX_MEM_BASE] = memory_base
    block[CTX_MEM_SIZE] = memory_size
    block[CTX_MEM_CAPACITY] = memory_capacity
    block[CTX_MEM_MAX_PAGES] = max_pages
    block[CTX_GLOBALS] = globals_at
    block[CTX_TABLES] = tables_at
    block[CTX_DATA] = data_at
    block[CTX_ELEMS] = elems_at
    block[CTX_WRITTEN] = written_at
    block[CTX_WRITTEN_COUNT] = written_count
    block[CTX_DEPTH_LIMIT] = depth_limit
    block[CTX_STACK_FLOOR] = stack_floor
    return block


ENTRY_PREFIX = "tw_call_"


def entry_name(func_index: int) -> str:
    return f"{ENTRY_PREFIX}{func_index}"


# A kernel's parameters take at most 4 KiB on every target: its live-ins by value take 2.
PARAM_WORDS_BY_VALUE = 256


def param_words(live_ins: int) -> int:
    """The 64-bit words a loop kernel's ``live_ins`` take: one each, and at least one."""
    return max(1, live_ins)


def params_by_value(words: int) -> bool:
    """Whether a GPU loop kernel of ``words`` live-in words takes them by value."""
    return words <= PARAM_WORDS_BY_VALUE


def loop_entry_name(index: int, gpu: bool) -> str:
    """The launch entry of the iteration kernel outlined as function ``index``."""
    return f"tw_kernel_{index}" if gpu else f"tw_loop_{index}"


def phase_entry_name(index: int) -> str:
    """The host's entry running one phase of a split loop's kernel ``index`` over a range of
    its threads (``compiler.lower.phases.lower_fission_entry``)."""
    return f"tw_phase_{index}"
