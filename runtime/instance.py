"""The initial state of an instance, computed as Wasm instantiation defines it.

Globals from their constant expressions, memory and tables at their minimum sizes with the
active data and element segments written in order (a segment out of bounds fails the
instantiation, as in Wasm), passive segments kept for ``memory.init``/``table.init``,
active and declarative ones dropped. Imports are stand-ins: imported globals read as
zero, imported memories and tables start empty at their minimum sizes, and imported
functions cannot be called by compiled code (the compiler refuses functions that reach
them). The state is plain bytes and integers; the host and GPU backends copy it into
their own memory and build the context block of :mod:`compiler.lower.abi` around it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field

from tensorwasm.compiler.frontend.module import Instr, WasmModule
from tensorwasm.compiler.lower.abi import PAGE_SIZE
from tensorwasm.compiler.traps import TrapKind, trap_message
from tensorwasm.dialect.types import F32, F64
from tensorwasm.support.errors import TensorWasmError

MAX_PAGES = 65536
# The most entries a table may start with (wasmtime's pooling allocator's default limit):
# a module asking for more is refused at instantiation, not answered with a MemoryError.
MAX_TABLE_ENTRIES = 10_000_000
MASK64 = (1 << 64) - 1


class InstantiationError(TensorWasmError):
    """The module cannot be instantiated (a segment does not fit, say)."""


@dataclass
class TableState:
    entries: list[int]  # 0 is null; a function reference is its index + 1
    max: int | None


@dataclass
class InstanceState:
    memory: bytearray | mmap.mmap | None  # anonymous memory where large: untouched pages cost nothing
    max_pages: int
    globals: list[int]  # bit patterns
    tables: list[TableState]
    data: list[bytes]  # passive segment bytes (empty once dropped)
    elems: list[list[int]]  # passive segment items (empty once dropped)
    global_types: list = field(default_factory=list)
    # The byte ranges of memory the active data segments wrote (sorted, merged): all else is
    # zero, so an executor copies only these.
    initialised: list[tuple[int, int]] = field(default_factory=list)


def eval_const(expr: list[Instr], globals_: list[int], global_types) -> int:
    """Evaluate a constant expression to a bit pattern (extended-const arithmetic too)."""
    stack: list[int] = []
    for instr in expr:
        name = instr.op.name
        if name == "end":
            break
        if name in ("i32.const", "i64.const"):
            stack.append(instr.imm & (MASK64 if name == "i64.const" else 0xFFFFFFFF))
        elif name in ("f32.const", "f64.const", "v128.const"):
            stack.append(instr.imm)
        elif name == "global.get":
            stack.append(globals_[instr.imm])
        elif name == "ref.null":
            stack.append(0)
        elif name == "ref.func":
            stack.append(instr.imm + 1)
        else:  # i32/i64 add, sub, mul
            b, a = stack.pop(), stack.pop()
            mask = 0xFFFFFFFF if name.startswith("i32") else MASK64
            op = name.split(".")[1]
            value = a + b if op == "add" else a - b if op == "sub" else a * b
            stack.append(value & mask)
    (value,) = stack
    return value


def initial_state(module: WasmModule) -> InstanceState:
    globals_: list[int] = []
    types = module.global_types()
    for _imp in module.imported("global"):
        globals_.append(0)
    for g in module.globals:
        globals_.append(eval_const(g.init, globals_, types))
    limits = module.memory_limits()
    memory = None
    max_pages = MAX_PAGES
    if limits:
        size = limits[0].min * PAGE_SIZE
        memory = mmap.mmap(-1, size) if size else bytearray()
        if limits[0].max is not None:
            max_pages = limits[0].max
    for t in module.table_types():
        if t.limits.min > MAX_TABLE_ENTRIES:
            raise InstantiationError(
                f"instantiation failed: a table of {t.limits.min} entries is more than the "
                f"{MAX_TABLE_ENTRIES} this backend holds"
            )
    tables = [TableState([0] * t.limits.min, t.limits.max) for t in module.table_types()]
    data = [seg.data if seg.mode == "passive" else b"" for seg in module.data]
    elems = [
        [eval_const(item, globals_, types) for item in seg.items] if seg.mode == "passive" else []
        for seg in module.elements
    ]
    for seg in module.elements:
        if seg.mode != "active":
            continue
        offset = eval_const(seg.offset_expr, globals_, types)
        items = [eval_const(item, globals_, types) for item in seg.items]
        table = tables[seg.table]
        if offset + len(items) > len(table.entries):
            raise InstantiationError(f"instantiation failed: {trap_message(TrapKind.TABLE_OUT_OF_BOUNDS)}")
        table.entries[offset : offset + len(items)] = items
    written: list[tuple[int, int]] = []
    for seg in module.data:
        if seg.mode != "active":
            continue
        offset = eval_const(seg.offset_expr, globals_, types)
        if memory is None or offset + len(seg.data) > len(memory):
            raise InstantiationError(f"instantiation failed: {trap_message(TrapKind.MEMORY_OUT_OF_BOUNDS)}")
        memory[offset : offset + len(seg.data)] = seg.data
        if seg.data:
            written.append((offset, offset + len(seg.data)))
    return InstanceState(memory, max_pages, globals_, tables, data, elems, types, _merged(written))


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges with overlapping and touching ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def global_bits_to_python(bits: int, ty) -> float | int:
    """For display: the value a global's bit pattern stands for."""
    if ty is F32:
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    if ty is F64:
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    return bits
