"""v128 values on the wire (``tensorwasm invoke``): ``0x`` and 32 hex digits, lane 0 in
the low bits, printed as they are read; wast2json's lane form read too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorwasm.dialect.types import V128
from tensorwasm.runtime.cli import main
from tensorwasm.runtime.values import ValueFormatError, parse_call_line, parse_json_value, to_json_value

LANES_1234 = 0x00000004_00000003_00000002_00000001


@pytest.mark.parametrize(
    "text", ["0x00000004000000030000000200000001", "0x" + "0" * 32, "0x" + "f" * 32, "0x7FC00000" + "ab" * 12]
)
def test_v128_round_trips_bit_for_bit(text: str) -> None:
    value = parse_json_value({"type": "v128", "value": text})
    assert value == (V128, int(text, 16))
    assert to_json_value(value) == {"type": "v128", "value": text.lower()}


@pytest.mark.parametrize(
    ("lane_type", "lanes", "bits"),
    [
        ("i32", ["1", "2", "3", "4"], LANES_1234),
        ("i64", ["-1", "0"], (1 << 64) - 1),
        ("i8", ["-1"] + ["0"] * 14 + ["128"], (0x80 << 120) | 0xFF),
        ("i16", ["65535", "0", "0", "0", "0", "0", "0", "-32768"], (0x8000 << 112) | 0xFFFF),
        ("f32", ["2143289344", "0", "0", "0"], 0x7FC00000),
        ("f64", ["0", "9221120237041090560"], 0x7FF8000000000000 << 64),
    ],
)
def test_wast2json_lane_form(lane_type: str, lanes: list[str], bits: int) -> None:
    assert parse_json_value({"type": "v128", "lane_type": lane_type, "value": lanes}) == (V128, bits)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"type": "v128", "value": "0x" + "0" * 31}, "0x and 32 hex digits"),
        ({"type": "v128", "value": "0x" + "0" * 33}, "0x and 32 hex digits"),
        ({"type": "v128", "value": "0" * 32}, "0x and 32 hex digits"),
        ({"type": "v128", "value": "0x" + "g" * 32}, "0x and 32 hex digits"),
        ({"type": "v128", "value": 5}, "0x and 32 hex digits"),
        ({"type": "v128", "lane_type": "i32", "value": ["1", "2", "3"]}, "list of 4 lane values"),
        (
            {"type": "v128", "lane_type": "i8", "value": ["256"] + ["0"] * 15},
            "lane 0: 256 is out of range for i8",
        ),
        ({"type": "v128", "lane_type": "i128", "value": ["0"]}, "unknown v128 lane type"),
        ({"type": "v128", "lane_type": "f32", "value": ["nan:canonical"] * 4}, "v128 lane 0"),
    ],
)
def test_bad_v128_values_say_why(obj, message: str) -> None:
    with pytest.raises(ValueFormatError, match=message):
        parse_json_value(obj)


def test_invoke_takes_and_prints_v128(tmp_path: Path, capsys) -> None:
    module = tmp_path / "v.wat"
    module.write_text(
        '(module (func (export "f") (param v128 i32) (result v128 i32)'
        " (i32x4.add (local.get 0) (i32x4.splat (local.get 1))) (i32x4.extract_lane 3 (local.get 0))))"
    )
    line = {"func": "f", "args": [{"type": "v128", "value": "0x0000000400000003000000020000ffff"},
                                  {"type": "i32", "value": "1"}]}  # fmt: skip
    assert parse_call_line(json.dumps(line))[1][0] == (V128, 0x0000000400000003000000020000FFFF)
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps(line) + "\n")
    assert main(["invoke", str(module), "--backend", "cpu", "--calls", str(calls)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"results": [{"type": "v128", "value": "0x00000005000000040000000300010000"},
                               {"type": "i32", "value": "4"}]}  # fmt: skip
