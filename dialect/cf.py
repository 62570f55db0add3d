"""The ``cf`` dialect: terminators. Every block ends in exactly one of these.

Branches carry their successor blocks and the values passed to those blocks' arguments;
the verifier checks those values against the argument types.
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import Custom, Dialect, Fixed
from tensorwasm.dialect.types import I1, I32


def _return(op, operands, attrs):
    # The function's result types are checked by the verifier, which knows them.
    return ()


br = Fixed("cf.br", "Jump. `cf.br ^bb2(%0, %1)`", (), (), terminator=True)
cond_br = Fixed(
    "cf.cond_br", "`cf.cond_br %c, ^bb1(%x), ^bb2` goes to the first target if %c.", (I1,), (),
    terminator=True,
)  # fmt: skip
switch = Fixed(
    "cf.switch",
    "`cf.switch %i [^bb1, ^bb2], default ^bb3`: the i-th target, or the last one when the "
    "index is out of range.",
    (I32,),
    (),
    terminator=True,
)
return_ = Custom("cf.return", "`cf.return %0, %1` returns the function's results.", _return,
                 terminator=True)  # fmt: skip
trap = Fixed(
    "cf.trap", "`cf.trap {kind = unreachable}` stops execution with a Wasm trap.", (), (),
    terminator=True,
)  # fmt: skip

CF = Dialect("cf", [br, cond_br, switch, return_, trap])
