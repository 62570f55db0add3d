"""TensorWasm's typed SSA dialect: types, op definitions, IR, builder, verifier, printer.

``OPS`` maps every op name to its definition; ``DIALECTS`` groups them as declared.
"""

from __future__ import annotations

from dialect.arith import ARITH
from dialect.cf import CF
from dialect.func import FUNC
from dialect.gpu import GPU
from dialect.mem import MEM
from dialect.opdef import Dialect, OpDef
from dialect.variables import GLOBAL, REF, TABLE

DIALECTS: tuple[Dialect, ...] = (ARITH, MEM, CF, FUNC, GLOBAL, TABLE, REF, GPU)
OPS: dict[str, OpDef] = {name: op for d in DIALECTS for name, op in d.ops.items()}
