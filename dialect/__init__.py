"""TensorWasm's typed SSA dialect: types, op definitions, IR, builder, verifier, printer.

``OPS`` maps every op name to its definition; ``DIALECTS`` groups them as declared. Both
are built at their first use: importing one submodule (``dialect.errors``, say, for the
project's exception type) loads that submodule alone, not every op definition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorwasm.dialect.opdef import Dialect, OpDef

    DIALECTS: tuple[Dialect, ...]
    OPS: dict[str, OpDef]


def __getattr__(name: str):
    if name not in ("DIALECTS", "OPS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from tensorwasm.dialect.arith import ARITH
    from tensorwasm.dialect.cf import CF
    from tensorwasm.dialect.func import FUNC
    from tensorwasm.dialect.gpu import GPU
    from tensorwasm.dialect.mem import MEM
    from tensorwasm.dialect.simd import SIMD
    from tensorwasm.dialect.variables import GLOBAL, REF, TABLE

    dialects = (ARITH, MEM, CF, FUNC, GLOBAL, TABLE, REF, GPU, SIMD)
    globals().update(DIALECTS=dialects, OPS={op_name: op for d in dialects for op_name, op in d.ops.items()})
    return globals()[name]
