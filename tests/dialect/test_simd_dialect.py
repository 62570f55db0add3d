"""The simd dialect's ops check their types and attributes when built (valid and invalid)."""

from __future__ import annotations

import pytest

from tensorwasm.dialect import arith, simd
from tensorwasm.dialect.types import F32, I32, I64, V128
from tensorwasm.support.errors import IRTypeError


def test_valid_ops_infer_their_results() -> None:
    assert simd.binary.infer([V128, V128], {"op": "i32x4.add"}) == (V128,)
    assert simd.splat.infer([F32], {"op": "f32x4.splat"}) == (V128,)
    assert simd.extract_lane.infer([V128], {"op": "i8x16.extract_lane_s", "lane": 15}) == (I32,)
    assert simd.replace_lane.infer([V128, I64], {"op": "i64x2.replace_lane", "lane": 1}) == (V128,)
    assert simd.shift.infer([V128, I32], {"op": "i16x8.shr_u"}) == (V128,)
    assert simd.test.infer([V128], {"op": "v128.any_true"}) == (I32,)
    assert simd.shuffle.infer([V128, V128], {"lanes": tuple(range(16))}) == (V128,)
    assert arith.constant.infer([], {"type": V128, "value": (1 << 128) - 1}) == (V128,)


@pytest.mark.parametrize(
    ("opdef", "operands", "attrs", "message"),
    [
        (simd.binary, [V128, V128], {"op": "add"}, "does not name a SIMD operation"),
        (simd.binary, [V128, V128], {"op": "i9x3.add"}, "does not name a SIMD operation"),
        (simd.binary, [V128, I32], {"op": "i32x4.add"}, "expects (v128, v128)"),
        (simd.splat, [I64], {"op": "i32x4.splat"}, "splats a i32"),
        (simd.extract_lane, [V128], {"op": "i32x4.extract_lane", "lane": 4}, "lane 4 is not below 4"),
        (simd.replace_lane, [V128, F32], {"op": "f64x2.replace_lane", "lane": 0}, "expects (v128, f64)"),
        (simd.shuffle, [V128, V128], {"lanes": (32,) * 16}, "16 byte indices below 32"),
        (simd.shuffle, [V128, V128], {"lanes": (0,) * 15}, "16 byte indices below 32"),
        (arith.constant, [], {"type": V128, "value": 1 << 128}, "not a 128-bit pattern"),
        (simd.shift, [V128, I64], {"op": "i64x2.shl"}, "expects (v128, i32)"),
    ],
)
def test_invalid_ops_are_refused_with_both_types(opdef, operands, attrs, message) -> None:
    with pytest.raises(IRTypeError) as info:
        opdef.infer(operands, attrs)
    assert message in str(info.value)
