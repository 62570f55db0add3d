"""Translation of the SIMD rows: one handler builder per dialect family of the opcode table.

Most SIMD opcodes become one ``simd`` op carrying the Wasm name (``simd.binary {op =
i32x4.add}``). The memory opcodes have no op of their own: a whole vector is one
``mem.load``/``mem.store`` of 128 bits, and the others combine a scalar access with a lane
op, in Wasm's order (the access traps before the vector is touched):

* ``v128.load8x8_s`` and kin: a 64-bit load, splatted, then the ``extend_low`` of its shape;
* ``v128.load32_splat``, ``load32_zero``: a scalar load, then a splat or a lane replaced in zero;
* ``v128.load16_lane``, ``store16_lane``: a scalar load and ``replace_lane``, or
  ``extract_lane`` and a narrow store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorwasm.compiler.frontend.opcodes import Opcode
from tensorwasm.dialect import OPS, mem, simd
from tensorwasm.dialect.types import I32, I64, V128

if TYPE_CHECKING:
    from tensorwasm.compiler.frontend.module import Instr
    from tensorwasm.compiler.frontend.translate import FunctionTranslator

Handler = Callable[["FunctionTranslator", "Instr"], None]

# Shape of a lane of the given width, as an integer: the splat/replace/extract that moves it.
_INT_SHAPE = {8: "i8x16", 16: "i16x8", 32: "i32x4", 64: "i64x2"}
# The scalar an access of the given width travels as.
_SCALAR = {8: I32, 16: I32, 32: I32, 64: I64}
# The shape a load{N}x{M}_{s,u} widens into.
_EXTENDED = {8: "i16x8", 16: "i32x4", 32: "i64x2"}


def _scalar_load(t: FunctionTranslator, addr, offset: int, align: int, bits: int, signed: bool = False):
    attrs = {"type": _SCALAR[bits], "bits": bits, "signed": signed, "offset": offset, "align": align}
    return t.b.op(mem.load, [addr], attrs).results[0]


def zero(t: FunctionTranslator):
    """The v128 zero (also every v128 local's initial value)."""
    return t.constant(V128, 0)


def _load(op: Opcode) -> tuple[Handler, str]:
    kind = op.name.removeprefix("v128.load")
    if kind == "":

        def handle(t: FunctionTranslator, instr: Instr) -> None:
            align, offset = instr.imm
            attrs = {"type": V128, "bits": 128, "signed": False, "offset": offset, "align": align}
            t.stack.append(t.b.op(mem.load, [t.stack.pop()], attrs).results[0])

        return handle, "mem.load {bits = 128} : v128"
    if "x" in kind:  # 8x8_s: eight 8-bit values widened to 16 bits each
        bits = int(kind.split("x")[0])
        widen = f"{_EXTENDED[bits]}.extend_low_{_INT_SHAPE[bits]}_{kind[-1]}"

        def handle(t: FunctionTranslator, instr: Instr) -> None:
            align, offset = instr.imm
            half = _scalar_load(t, t.stack.pop(), offset, align, 64)
            both = t.b.value(simd.splat, half, op="i64x2.splat")
            t.stack.append(t.b.value(simd.unary, both, op=widen))

        return handle, f"mem.load {{bits = 64}} + simd.splat + simd.unary {{op = {widen}}}"
    bits = int(kind.split("_")[0])
    shape = _INT_SHAPE[bits]
    if kind.endswith("_splat"):

        def handle(t: FunctionTranslator, instr: Instr) -> None:
            align, offset = instr.imm
            value = _scalar_load(t, t.stack.pop(), offset, align, bits)
            t.stack.append(t.b.value(simd.splat, value, op=f"{shape}.splat"))

        return handle, f"mem.load {{bits = {bits}}} + simd.splat {{op = {shape}.splat}}"
    if kind.endswith("_zero"):

        def handle(t: FunctionTranslator, instr: Instr) -> None:
            align, offset = instr.imm
            value = _scalar_load(t, t.stack.pop(), offset, align, bits)
            t.stack.append(t.b.value(simd.replace_lane, zero(t), value, op=f"{shape}.replace_lane", lane=0))

        return handle, f"mem.load {{bits = {bits}}} + simd.replace_lane in arith.constant 0 : v128"

    def handle(t: FunctionTranslator, instr: Instr) -> None:  # load{N}_lane
        align, offset, lane = instr.imm
        addr, vector = t.pop(2)
        value = _scalar_load(t, addr, offset, align, bits)
        t.stack.append(t.b.value(simd.replace_lane, vector, value, op=f"{shape}.replace_lane", lane=lane))

    return handle, f"mem.load {{bits = {bits}}} + simd.replace_lane {{op = {shape}.replace_lane}}"


def _store(op: Opcode) -> tuple[Handler, str]:
    kind = op.name.removeprefix("v128.store")
    if kind == "":

        def handle(t: FunctionTranslator, instr: Instr) -> None:
            align, offset = instr.imm
            t.b.op(mem.store, t.pop(2), {"bits": 128, "offset": offset, "align": align})

        return handle, "mem.store {bits = 128}"
    bits = int(kind.split("_")[0])
    shape = _INT_SHAPE[bits]
    extract = f"{shape}.extract_lane_u" if bits < 32 else f"{shape}.extract_lane"

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        align, offset, lane = instr.imm
        addr, vector = t.pop(2)
        value = t.b.value(simd.extract_lane, vector, op=extract, lane=lane)
        t.b.op(mem.store, [addr, value], {"bits": bits, "offset": offset, "align": align})

    return handle, f"simd.extract_lane {{op = {extract}}} + mem.store {{bits = {bits}}}"


def _const(t: FunctionTranslator, instr: Instr) -> None:
    t.stack.append(t.constant(V128, instr.imm))


def _shuffle(t: FunctionTranslator, instr: Instr) -> None:
    a, b = t.pop(2)
    t.stack.append(t.b.value(simd.shuffle, a, b, lanes=instr.imm))


def _family(op: Opcode) -> Handler:
    """A row mapped to one op of its family, with the Wasm name (and lane) as attributes."""
    opdef = OPS[op.dialect]
    arity = len(op.operand_types)
    lane = op.imm.name == "LANE"

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        attrs = {"op": op.name, "lane": instr.imm} if lane else {"op": op.name}
        t.stack.append(t.b.op(opdef, t.pop(arity), attrs).results[0])

    return handle


def handler(op: Opcode) -> tuple[Handler, str]:
    """The handler of SIMD row ``op`` and the docs' description of what it emits."""
    if op.name.startswith("v128.load"):
        return _load(op)
    if op.name.startswith("v128.store"):
        return _store(op)
    if op.name == "v128.const":
        return _const, "arith.constant : v128"
    if op.dialect == "simd.shuffle":
        return _shuffle, "simd.shuffle {lanes = ...}"
    return _family(op), f"{op.dialect} {{op = {op.name}}}"
