"""The ``func`` dialect: direct and indirect calls between Wasm functions.

``sig`` is the callee's :class:`~dialect.ir.FuncSig`; the operands are the arguments, and
for ``call_indirect`` the table slot last. A call of an imported function stays a call;
whether a backend can run it is the backend's decision.
"""

from __future__ import annotations

from tensorwasm.dialect.ir import FuncSig
from tensorwasm.dialect.opdef import Custom, Dialect
from tensorwasm.dialect.types import I32


def _check_args(op, args, sig):
    if not isinstance(sig, FuncSig):
        raise op.fail("needs a 'sig' attribute")
    if tuple(args) != sig.params:
        got = ", ".join(map(str, args))
        raise op.fail(f"arguments ({got}) do not match the signature {sig}")
    return sig.results


def _call(op, operands, attrs):
    if not isinstance(attrs.get("callee"), int):
        raise op.fail("needs a 'callee' function index")
    return _check_args(op, operands, attrs.get("sig"))


def _call_indirect(op, operands, attrs):
    if not operands or operands[-1] is not I32:
        raise op.fail("the table slot operand must be an i32")
    return _check_args(op, operands[:-1], attrs.get("sig"))


call = Custom("func.call", "`%r = func.call @3(%a, %b) : (i32, i32) -> (i32)`", _call)
call_indirect = Custom(
    "func.call_indirect",
    "`%r = func.call_indirect %a, %slot {table = 0, type = 2}`: traps on a null slot, a "
    "slot outside the table and a signature mismatch.",
    _call_indirect,
)

FUNC = Dialect("func", [call, call_indirect])
