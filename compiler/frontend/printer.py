"""A readable listing of a decoded module (``inspect --stage wasm``).

Sections as WAT-like declarations; function bodies one instruction per line with its
byte offset, indented by nesting. Immediates print from the opcode row's immediate kind.
"""

from __future__ import annotations

from tensorwasm.compiler.frontend.decoder import float_from_bits
from tensorwasm.compiler.frontend.module import Instr, WasmModule
from tensorwasm.compiler.frontend.opcodes import Imm
from tensorwasm.dialect.types import Type


def _imm(instr: Instr) -> str:
    kind, imm = instr.op.imm, instr.imm
    if kind is Imm.NONE or imm is None:
        return ""
    if kind is Imm.MEMARG:
        return _memarg(*imm)
    if kind is Imm.MEMARG_LANE:  # WAT's order: the memarg, then the lane
        align, offset, lane = imm
        return f"{_memarg(align, offset)} {lane}"
    if kind is Imm.V128:  # as four i32 lanes, lane 0 first (the low bits), as wasm-tools prints
        lanes = (f"0x{(imm >> (32 * k)) & 0xFFFFFFFF:08x}" for k in range(4))
        return " i32x4 " + " ".join(lanes)
    if kind is Imm.F32 or kind is Imm.F64:
        value = float_from_bits(imm, kind is Imm.F64)
        return f" {value!r}" if value == value else f" nan:0x{imm:x}"
    if kind is Imm.BLOCKTYPE:
        return f" (result {imm})" if isinstance(imm, Type) else f" (type {imm[1]})"
    if kind is Imm.BR_TABLE:
        labels, default = imm
        return " " + " ".join(map(str, (*labels, default)))
    if isinstance(imm, tuple):
        return " " + " ".join(map(str, imm))
    return f" {imm}"


def _memarg(align: int, offset: int) -> str:
    return f" offset={offset} align={1 << align}" if offset else f" align={1 << align}"


def print_body(body: list[Instr], indent: int = 2) -> list[str]:
    lines = []
    depth = indent
    for instr in body:
        name = instr.op.name
        if name in ("end", "else"):
            depth -= 1
        lines.append(f"{instr.offset:>8x}  {'  ' * depth}{name}{_imm(instr)}")
        if name in ("block", "loop", "if", "else"):
            depth += 1
    return lines


def print_module(module: WasmModule, only: set[int] | None = None) -> str:
    """The module as text; ``only`` restricts the bodies printed to these function indices."""
    out = ["(module"]
    for i, sig in enumerate(module.types):
        params = f" (param {' '.join(map(str, sig.params))})" if sig.params else ""
        results = f" (result {' '.join(map(str, sig.results))})" if sig.results else ""
        out.append(f"  (type {i} (func{params}{results}))")
    func_index = 0
    for imp in module.imports:
        desc = imp.desc
        if imp.kind == "func":
            desc = f"func {func_index} (type {imp.desc})"
            func_index += 1
        out.append(f'  (import "{imp.module}" "{imp.name}" ({imp.kind} {desc}))')
    for i, table in enumerate(module.tables):
        out.append(f"  (table {i} {table.limits.min} {table.limits.max or ''} {table.elem})")
    for i, mem in enumerate(module.memories):
        out.append(f"  (memory {i} {mem.min} {'' if mem.max is None else mem.max})")
    for i, glob in enumerate(module.globals):
        mut = "mut " if glob.type.mutable else ""
        init = " ".join(f"{x.op.name}{_imm(x)}" for x in glob.init[:-1])
        out.append(f"  (global {i} ({mut}{glob.type.type}) ({init}))")
    for exp in module.exports:
        out.append(f'  (export "{exp.name}" ({exp.kind} {exp.index}))')
    if module.start is not None:
        out.append(f"  (start {module.start})")
    for i, seg in enumerate(module.elements):
        out.append(f"  (elem {i} {seg.mode} table={seg.table} items={len(seg.items)})")
    for i, seg in enumerate(module.data):
        out.append(f"  (data {i} {seg.mode} {len(seg.data)} bytes)")
    first = module.num_imported_funcs
    for i, code in enumerate(module.codes):
        index = first + i
        if only is not None and index not in only:
            continue
        exports = "".join(f' (export "{e}")' for e in module.export_names("func", index))
        out.append(f"  (func {index} ${module.func_name(index)} (type {module.funcs[i]}){exports}")
        if code.locals:
            out.append(f"    (local {' '.join(map(str, code.locals))})")
        out.extend(print_body(code.body[:-1]))
        out.append("  )")
    for custom in module.customs:
        out.append(f'  (@custom "{custom.name}" {len(custom.data)} bytes)')
    out.append(")")
    return "\n".join(out) + "\n"
