"""The textual form of the dialect, for ``inspect --stage dialect`` and for tests.

Values are numbered in order of definition (``%0``...), blocks in order (``^bb0``...).
An op prints as ``%r = name operands {attrs} : type``; a branch names its targets with
the values it passes; a loop header is marked with the Wasm offset of its ``loop``.
"""

from __future__ import annotations

import math
import struct

from tensorwasm.dialect.ir import FuncSig, Function, Module, Op, Value
from tensorwasm.dialect.types import F32, F64, V128, Type


def format_constant(type: Type, bits: int) -> str:
    """A constant's value as text: signed decimal, or a float with its bits where needed."""
    if type is V128:
        return f"0x{bits:032x}"
    if type is F32 or type is F64:
        fmt, ifmt = ("<f", "<I") if type is F32 else ("<d", "<Q")
        value = struct.unpack(fmt, struct.pack(ifmt, bits))[0]
        if math.isnan(value):
            return f"nan(0x{bits:0{type.bits // 4}x})"
        return repr(value)
    if bits >= 1 << (type.bits - 1) and type.bits > 1:
        return str(bits - (1 << type.bits))
    return str(bits)


def _attr(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (Type, FuncSig)):
        return str(value)
    if isinstance(value, str):
        return value if value.isidentifier() else repr(value)
    return str(value)


class _Namer:
    def __init__(self, func: Function):
        self.names: dict[Value, str] = {}
        self.blocks = {b: f"^bb{i}" for i, b in enumerate(func.blocks)}

    def __call__(self, value: Value) -> str:
        name = self.names.get(value)
        if name is None:
            name = self.names[value] = f"%{len(self.names)}"
        return name


def print_op(op: Op, name: _Namer) -> str:
    attrs = dict(op.attrs)
    text = ""
    if op.results:
        text = ", ".join(name(r) for r in op.results) + " = "
    text += op.name
    if op.name == "arith.constant":
        return f"{text} {format_constant(attrs['type'], attrs['value'])} : {attrs['type']}"
    pred = attrs.pop("pred", None)
    parts = [pred] if pred else []
    parts += [name(v) for v in op.operands]
    if parts:
        text += " " + ", ".join(parts)
    if op.successors:
        targets = []
        for succ in op.successors:
            target = name.blocks[succ.block]
            if succ.args:
                target += "(" + ", ".join(name(v) for v in succ.args) + ")"
            targets.append(target)
        if op.name == "cf.switch":
            text += " [" + ", ".join(targets[:-1]) + "], default " + targets[-1]
        else:
            text += " " + ", ".join(targets)
    to = attrs.pop("to", None)
    if op.results and isinstance(attrs.get("type"), Type):
        del attrs["type"]  # the result type says it
    if attrs:
        text += " {" + ", ".join(f"{k} = {_attr(v)}" for k, v in attrs.items()) + "}"
    if to is not None:
        text += f" : {op.operands[0].type} to {to}"
    elif op.results:
        text += " : " + ", ".join(str(r.type) for r in op.results)
    elif op.operands and op.name not in ("cf.return", "cf.cond_br", "cf.switch"):
        text += " : " + str(op.operands[-1].type)
    return text


def print_function(func: Function) -> str:
    sig = ", ".join(map(str, func.params))
    results = ", ".join(map(str, func.results))
    head = f"func @{func.name}({sig}) -> ({results})"
    if func.exports:
        head += " exports " + ", ".join(repr(e) for e in func.exports)
    if func.is_import:
        module, field = func.import_name
        return f"{head} import {module!r}.{field!r}\n"
    name = _Namer(func)
    lines = [head + " {"]
    for block in func.blocks:
        label = name.blocks[block]
        if block.args:
            label += "(" + ", ".join(f"{name(a)}: {a.type}" for a in block.args) + ")"
        label += ":"
        loop = block.attrs.get("loop")
        if loop is not None:
            label += f"  // loop header, wasm +0x{loop.offset:x}, depth {loop.depth}"
        lines.append(label)
        for op in block.ops:
            lines.append("  " + print_op(op, name))
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_module(module: Module) -> str:
    return "\n".join(print_function(f) for f in module.functions)
