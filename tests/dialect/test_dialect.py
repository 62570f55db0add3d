"""The dialect: typed building, the verifier's rules (valid and invalid IR), the printer."""

from __future__ import annotations

import pytest

from tensorwasm.dialect import arith, cf, mem
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Function, Op, Successor
from tensorwasm.dialect.printer import print_function
from tensorwasm.dialect.types import F32, I1, I32, I64
from tensorwasm.dialect.verifier import verify_function
from tensorwasm.support.errors import IRTypeError, VerifyError


def new_function(params=(I32, I32), results=(I32,)) -> tuple[Function, Builder]:
    func = Function("f", 0, params, results)
    b = Builder(func, func.add_block(params))
    return func, b


# -- valid IR --------------------------------------------------------------------------------


def test_straight_line_function_verifies_and_prints() -> None:
    func, b = new_function()
    x, y = func.entry.args
    s = b.value(arith.add, x, y)
    c = b.value(arith.cmpi, s, x, pred="ult")
    b.ret([b.value(arith.zext, c, to=I32)])
    verify_function(func)
    assert print_function(func) == (
        "func @f(i32, i32) -> (i32) {\n"
        "^bb0(%0: i32, %1: i32):\n"
        "  %2 = arith.add %0, %1 : i32\n"
        "  %3 = arith.cmpi ult, %2, %0 : i1\n"
        "  %4 = arith.zext %3 : i1 to i32\n"
        "  cf.return %4\n"
        "}\n"
    )


def test_loop_with_block_arguments_verifies() -> None:
    func, b = new_function(params=(I32,), results=(I32,))
    (n,) = func.entry.args
    header = func.add_block([I32, I32])
    exit_ = func.add_block([I32])
    zero = b.constant(I32, 0)
    b.br(header, [zero, zero])
    b.block = header
    i, acc = header.args
    acc2 = b.value(arith.add, acc, i)
    i2 = b.value(arith.add, i, b.constant(I32, 1))
    done = b.value(arith.cmpi, i2, n, pred="eq")
    b.cond_br(done, exit_, [acc2], header, [i2, acc2])
    b.block = exit_
    b.ret(exit_.args)
    verify_function(func)
    assert "cf.cond_br %7 ^bb2(%4), ^bb1(%6, %4)" in print_function(func)


def test_constants_print_signed_and_float_bits() -> None:
    func, b = new_function(params=(), results=())
    b.constant(I32, -1)
    b.constant(F32, 0x7FA00000)
    b.constant(F32, 0x3FC00000)
    b.ret([])
    text = print_function(func)
    assert "arith.constant -1 : i32" in text
    assert "arith.constant nan(0x7fa00000) : f32" in text
    assert "arith.constant 1.5 : f32" in text


# -- type errors at build time ----------------------------------------------------------------


def test_builder_names_both_types_on_mismatch() -> None:
    func, b = new_function(params=(I32, I64))
    x, y = func.entry.args
    with pytest.raises(IRTypeError, match=r"arith\.add: operand types i32 and i64 differ"):
        b.value(arith.add, x, y)


def test_builder_rejects_float_op_on_ints_and_bad_casts() -> None:
    func, b = new_function()
    x, _ = func.entry.args
    with pytest.raises(IRTypeError, match="not one of f32, f64"):
        b.value(arith.fadd, x, x)
    with pytest.raises(IRTypeError, match=r"cannot convert i32 to i32"):
        b.value(arith.zext, x, to=I32)
    with pytest.raises(IRTypeError, match="cannot load 64 bits into i32"):
        b.op(mem.load, [x], {"type": I32, "bits": 64, "signed": False, "offset": 0})
    with pytest.raises(IRTypeError, match="condition must be i1"):
        b.value(arith.select, x, x, x)


def test_builder_checks_branch_argument_types() -> None:
    func, b = new_function()
    target = func.add_block([F32])
    with pytest.raises(IRTypeError, match="cannot pass i32 to a f32 block argument"):
        b.br(target, [func.entry.args[0]])


# -- the verifier's rules ----------------------------------------------------------------------


def test_missing_terminator() -> None:
    func, b = new_function()
    b.value(arith.add, *func.entry.args)
    with pytest.raises(VerifyError, match="does not end in a terminator"):
        verify_function(func)


def test_terminator_in_the_middle() -> None:
    func, b = new_function()
    b.ret([func.entry.args[0]])
    b.ret([func.entry.args[0]])
    with pytest.raises(VerifyError, match="is not the last op"):
        verify_function(func)


def test_use_not_dominated_by_definition() -> None:
    func, b = new_function()
    x, y = func.entry.args
    left, right, join = func.add_block(), func.add_block(), func.add_block()
    cond = b.value(arith.cmpi, x, y, pred="eq")
    b.cond_br(cond, left, [], right, [])
    b.block = left
    only_left = b.value(arith.add, x, y)
    b.br(join)
    b.block = right
    b.br(join)
    b.block = join
    b.ret([only_left])
    with pytest.raises(VerifyError, match="not dominated"):
        verify_function(func)


def test_use_before_definition_in_one_block() -> None:
    func, b = new_function()
    x, y = func.entry.args
    first = b.value(arith.add, x, y)
    second = b.value(arith.mul, first, y)
    b.ret([second])
    ops = func.entry.ops
    ops[0], ops[1] = ops[1], ops[0]
    with pytest.raises(VerifyError, match="not dominated"):
        verify_function(func)


def test_return_types_must_match() -> None:
    func, b = new_function(results=(I64,))
    b.ret([func.entry.args[0]])
    with pytest.raises(VerifyError, match=r"returns \(i32\) from a function of results \(i64\)"):
        verify_function(func)


def test_unreachable_block_is_reported() -> None:
    func, b = new_function()
    b.ret([func.entry.args[0]])
    dead = func.add_block()
    Builder(func, dead).trap("unreachable")
    with pytest.raises(VerifyError, match="unreachable from the entry"):
        verify_function(func)


def test_patched_branch_with_wrong_arguments_is_caught() -> None:
    func, _b = new_function()
    target = func.add_block([I32, I32])
    op = Op(cf.br, [], (), {}, [Successor(target, [func.entry.args[0]])])
    op.block = func.entry
    func.entry.ops.append(op)
    Builder(func, target).ret([target.args[0]])
    with pytest.raises(VerifyError, match="takes 2 argument"):
        verify_function(func)


def test_op_with_tampered_operand_type_is_caught() -> None:
    func, b = new_function()
    x, y = func.entry.args
    s = b.value(arith.add, x, y)
    b.ret([s])
    s.owner.operands[1] = b.value(arith.cmpi, x, y, pred="eq")  # an i1 now
    func.entry.ops.insert(0, func.entry.ops.pop())  # keep the cmpi before its use
    with pytest.raises(VerifyError, match=r"arith\.add"):
        verify_function(func)


def test_branch_argument_not_dominated_by_its_definition() -> None:
    """A value passed along a branch is a use like an operand: defined in a sibling block,
    it is caught."""
    func, b = new_function()
    x, y = func.entry.args
    left, right, join = func.add_block(), func.add_block(), func.add_block([I32])
    cond = b.value(arith.cmpi, x, y, pred="eq")
    b.cond_br(cond, left, [], right, [])
    b.block = left
    only_left = b.value(arith.add, x, y)
    b.br(join, [only_left])
    b.block = right
    b.br(join, [x])
    b.block = join
    b.ret(join.args)
    verify_function(func)  # (dominated: passed from its own block)
    right.ops.pop()
    Builder(func, right).br(join, [only_left])
    with pytest.raises(VerifyError, match=r"\^bb2: a use is not dominated by its definition in \^bb1"):
        verify_function(func)


def test_use_of_a_value_of_another_function() -> None:
    other, ob = new_function()
    foreign = ob.value(arith.add, *other.entry.args)
    func, b = new_function()
    b.ret([b.value(arith.add, func.entry.args[0], foreign)])
    with pytest.raises(VerifyError, match="uses a value defined outside the function"):
        verify_function(func)


def test_use_of_an_op_removed_from_its_block() -> None:
    func, b = new_function()
    x, y = func.entry.args
    s = b.value(arith.add, x, y)
    b.ret([s])
    func.entry.ops.remove(s.owner)
    with pytest.raises(VerifyError, match="uses a value defined outside the function"):
        verify_function(func)


def test_i1_constants_and_types_are_interned() -> None:
    _func, b = new_function(params=(), results=())
    assert b.constant(I1, 1).type is I1
