"""Wasm values, call results and trap kinds: the encoding every backend and the CLI share.

A value is a :data:`WasmValue`, a pair ``(type, bits)`` of a dialect type and an unsigned
bit pattern: integers as their unsigned two's complement bits, floats as their IEEE bits
(so NaN payloads and signalling NaNs survive every trip), references as an integer with
0 for null (a funcref is the function index + 1; an externref is the host's handle).
Comparing two backends is then comparing tuples of integers, bit for bit.

On the wire (the CLI, the spec-test oracle) values use wabt's ``wast2json`` encoding:
``{"type": "f32", "value": "2143289344"}``, the unsigned decimal of the bits, and
``"null"`` for a null reference. A ``v128`` is ``"0x"`` and 32 hex digits, the 128-bit
number whose low bits are lane 0 (``i32x4 1 2 3 4`` ends ``...000200000001``); wast2json's
lane form ``{"type": "v128", "lane_type": "i32", "value": ["1", "2", "3", "4"]}`` is
accepted too. Expected results may also be ``"nan:canonical"`` or ``"nan:arithmetic"``, which match a class of NaNs rather than one bit pattern.

Traps are named by :class:`TrapKind`. Its codes are an ABI: compiled code writes them
into its trap slot and the runtime reads them back, so they never change meaning. The
messages are wasmtime 50's (the text after ``wasm trap:``), so a trap reads the same on
every backend.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from tensorwasm.compiler.traps import TRAP_MESSAGES as TRAP_MESSAGES
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.compiler.traps import trap_message as trap_message
from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, V128, Type
from tensorwasm.support.errors import TensorWasmError

WasmValue = tuple[Type, int]
"""A value: its dialect type and its unsigned bit pattern (see the module docstring)."""

#: The types a Wasm value can have, by their wast2json name.
VALUE_TYPES: dict[str, Type] = {t.name: t for t in (I32, I64, F32, F64, FUNCREF, EXTERNREF, V128)}

_DECIMAL = re.compile(r"-?[0-9]+")
_V128_HEX = re.compile(r"0x[0-9a-fA-F]{32}")
_LANE_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "f32": 32, "f64": 64}


class ValueFormatError(TensorWasmError):
    """A value, an argument list or a call line is not in the expected format."""


class NanPattern(enum.Enum):
    """An expected result that matches a class of NaNs rather than one bit pattern."""

    CANONICAL = "nan:canonical"
    ARITHMETIC = "nan:arithmetic"


ExpectedValue = WasmValue | tuple[Type, NanPattern]
"""An expected result: an exact value, or a float type with a NaN pattern."""


# wasmtime.TrapCode member name -> our kind. By name so this module need not load wasmtime.
_WASMTIME_TRAP_CODES: dict[str, TrapKind] = {
    "UNREACHABLE": TrapKind.UNREACHABLE,
    "MEMORY_OUT_OF_BOUNDS": TrapKind.MEMORY_OUT_OF_BOUNDS,
    "INTEGER_DIVISION_BY_ZERO": TrapKind.INTEGER_DIVIDE_BY_ZERO,
    "INTEGER_OVERFLOW": TrapKind.INTEGER_OVERFLOW,
    "BAD_CONVERSION_TO_INTEGER": TrapKind.BAD_CONVERSION_TO_INTEGER,
    "TABLE_OUT_OF_BOUNDS": TrapKind.TABLE_OUT_OF_BOUNDS,
    "INDIRECT_CALL_TO_NULL": TrapKind.INDIRECT_CALL_TO_NULL,
    "BAD_SIGNATURE": TrapKind.BAD_SIGNATURE,
    "STACK_OVERFLOW": TrapKind.STACK_OVERFLOW,
    "NULL_REFERENCE": TrapKind.NULL_REFERENCE,
}


def trap_kind_from_wasmtime(trap: Any) -> TrapKind | None:
    """The kind of a ``wasmtime.Trap``; None for a trap without a code (raised by the host)
    or with a code outside Wasm's core traps (fuel, interrupts, components...)."""
    code = trap.trap_code
    return None if code is None else _WASMTIME_TRAP_CODES.get(code.name)


@dataclass(frozen=True)
class CallResult:
    """The outcome of a call: its results, or the trap it raised, or why it could not run."""

    values: tuple[WasmValue, ...] = ()
    trap: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.trap is not None and self.error is not None:
            raise ValueError("a call result is a trap or an error, not both")
        if self.values and (self.trap is not None or self.error is not None):
            raise ValueError("a call that trapped or failed has no values")


def check_value(value: WasmValue) -> WasmValue:
    """``value`` itself after checking that it is a well-formed value; ValueFormatError if not."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ValueFormatError(f"a value is a (type, bits) pair, not {value!r}")
    ty, bits = value
    if VALUE_TYPES.get(getattr(ty, "name", None)) is not ty:
        raise ValueFormatError(f"{ty!r} is not a Wasm value type")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits < 1 << ty.bits:
        raise ValueFormatError(f"{bits!r} is not a {ty.bits}-bit pattern for a {ty.name} value")
    return value


def parse_json_value(obj: Any) -> WasmValue:
    """The value a wast2json object ``{"type": ..., "value": ...}`` denotes.

    Integers may also be signed decimals (wrapped to their bits). NaN patterns are refused:
    they describe results, not arguments (see :func:`parse_expected_value`).
    """
    ty, bits = _parse_json(obj, allow_nan_pattern=False)
    assert isinstance(bits, int)
    return ty, bits


def parse_expected_value(obj: Any) -> ExpectedValue:
    """Like :func:`parse_json_value`, and accepting ``"nan:canonical"``/``"nan:arithmetic"``."""
    return _parse_json(obj, allow_nan_pattern=True)


def _parse_json(obj: Any, *, allow_nan_pattern: bool) -> ExpectedValue:
    if not isinstance(obj, dict):
        raise ValueFormatError(f'a value is an object {{"type": ..., "value": ...}}, not {obj!r}')
    if obj.get("type") == "v128" and set(obj) == {"type", "lane_type", "value"}:
        return V128, _parse_v128_lanes(obj["lane_type"], obj["value"])
    if set(obj) != {"type", "value"}:
        raise ValueFormatError(f'a value has exactly the keys "type" and "value", not {sorted(obj)}')
    ty = VALUE_TYPES.get(obj["type"]) if isinstance(obj["type"], str) else None
    if ty is None:
        raise ValueFormatError(
            f"unknown value type {obj['type']!r} (expected one of {', '.join(VALUE_TYPES)})"
        )
    raw = obj["value"]
    if ty.is_float and raw in ("nan:canonical", "nan:arithmetic"):
        if not allow_nan_pattern:
            raise ValueFormatError(f"{raw} matches a class of NaNs: it can be expected, not passed")
        return ty, NanPattern(raw)
    if ty.is_ref and raw == "null":
        return ty, 0
    if ty is V128:
        if not (isinstance(raw, str) and _V128_HEX.fullmatch(raw)):
            raise ValueFormatError(f"{raw!r} is not a v128 value: 0x and 32 hex digits")
        return ty, int(raw, 16)
    if isinstance(raw, int) and not isinstance(raw, bool):
        number = raw
    elif isinstance(raw, str) and _DECIMAL.fullmatch(raw):
        number = int(raw)
    else:
        raise ValueFormatError(f"{raw!r} is not a decimal {ty.name} value")
    low = -(1 << (ty.bits - 1)) if ty.is_int else 0
    if not low <= number < 1 << ty.bits:
        kind = "signed or unsigned" if ty.is_int else "unsigned bit pattern"
        raise ValueFormatError(f"{number} is out of range for {ty.name} (a {ty.bits}-bit {kind})")
    return ty, number & ((1 << ty.bits) - 1)


def _parse_v128_lanes(lane_type: Any, lanes: Any) -> int:
    """The bits of wast2json's v128 lane form: lane 0 in the low bits."""
    width = _LANE_BITS.get(lane_type) if isinstance(lane_type, str) else None
    if width is None:
        raise ValueFormatError(
            f"unknown v128 lane type {lane_type!r} (expected one of {', '.join(_LANE_BITS)})"
        )
    count = 128 // width
    if not (isinstance(lanes, list) and len(lanes) == count):
        raise ValueFormatError(
            f"a v128 of {lane_type} lanes has a list of {count} lane values, not {lanes!r}"
        )
    bits = 0
    for k, lane in enumerate(lanes):
        lane_ty = VALUE_TYPES[lane_type] if lane_type in VALUE_TYPES else I32
        try:
            _, lane_bits = parse_json_value({"type": lane_ty.name, "value": lane})
        except ValueFormatError as exc:
            raise ValueFormatError(f"v128 lane {k}: {exc}") from None
        if not -(1 << (width - 1)) <= int(lane) < 1 << width:
            raise ValueFormatError(f"v128 lane {k}: {lane} is out of range for {lane_type}")
        bits |= (lane_bits & ((1 << width) - 1)) << (k * width)
    return bits


def to_json_value(value: WasmValue) -> dict[str, str]:
    """The wast2json object for ``value`` (the unsigned decimal of its bits, or "null"; a
    v128 as 0x and 32 hex digits)."""
    ty, bits = check_value(value)
    if ty is V128:
        return {"type": "v128", "value": f"0x{bits:032x}"}
    return {"type": ty.name, "value": "null" if ty.is_ref and bits == 0 else str(bits)}


def matches(expected: ExpectedValue, actual: WasmValue) -> bool:
    """Whether ``actual`` is ``expected``: bit for bit, or a NaN of the expected pattern.

    A canonical NaN has only the quiet bit of the payload set; an arithmetic NaN has the
    quiet bit set and any other payload (Wasm spec, 4.3.2).
    """
    ty, want = expected
    if actual[0] is not ty:
        return False
    if not isinstance(want, NanPattern):
        return actual[1] == want
    mantissa = 23 if ty.bits == 32 else 52
    exponent_and_quiet = ((1 << (ty.bits - mantissa)) - 1) << (mantissa - 1)
    magnitude = actual[1] & ((1 << (ty.bits - 1)) - 1)
    if want is NanPattern.CANONICAL:
        return magnitude == exponent_and_quiet
    return magnitude & exponent_and_quiet == exponent_and_quiet


def parse_call_line(line: str) -> tuple[str, list[WasmValue]]:
    """The export name and arguments of a call line ``{"func": "<export>", "args": [...]}``."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueFormatError(f"a call line is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueFormatError('a call line is a JSON object {"func": ..., "args": [...]}')
    unknown = set(obj) - {"func", "args"}
    if unknown:
        raise ValueFormatError(f"unknown key(s) in a call line: {', '.join(sorted(unknown))}")
    if not isinstance(obj.get("func"), str):
        raise ValueFormatError('a call line needs "func": the name of the exported function')
    args = obj.get("args", [])
    if not isinstance(args, list):
        raise ValueFormatError(f'"args" is a list of values, not {args!r}')
    values: list[WasmValue] = []
    for i, arg in enumerate(args):
        try:
            values.append(parse_json_value(arg))
        except ValueFormatError as exc:
            raise ValueFormatError(f"args[{i}]: {exc}") from None
    return obj["func"], values


def format_result(result: CallResult) -> str:
    """``result`` as exactly one JSON line: ``{"results": [...]}``, ``{"trap": ...}`` or ``{"error": ...}``."""
    if result.error is not None:
        obj: dict[str, Any] = {"error": result.error}
    elif result.trap is not None:
        obj = {"trap": result.trap}
    else:
        obj = {"results": [to_json_value(v) for v in result.values]}
    return json.dumps(obj)
