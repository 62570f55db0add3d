"""Memory accesses of a loop as polynomials in the loops' counters and the live-in values.

Every load and store in the candidate loop's body (inner loops included, in function
order) gets its address from :meth:`LoopValues.expr` plus its static offset. The address
is kept only where it is affine in each counter of the nest (its coefficient of a counter
is free of counters); otherwise it is unknown. An unknown store address rejects the loop:
nothing could say which iterations it meets. An unknown load address is a *gather*: the
kernel checks each address it loads against the ranges the loop writes (see
:attr:`LoopPlan.gathers`). An access after an inner loop rather than inside it may see that
loop's counter at its exit value; those counters are listed in ``beyond``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject
from tensorwasm.compiler.analysis.plan import Access
from tensorwasm.compiler.analysis.poly import Poly

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues


def collect_accesses(values: LoopValues) -> list[Access]:
    """The loads and stores of the candidate loop, in function order; :class:`Reject` for a
    store whose address is not affine."""
    out = []
    counters = set(values.counters.values())
    for block in values.body_order:
        for op in block.ops:
            if op.name not in ("mem.load", "mem.store"):
                continue
            address = values.expr(op.operands[0])
            if address is not None:
                address = address + Poly.const(op.attrs["offset"])
                for c in [s for s in address.symbols() if s.leaves() & counters]:
                    split = address.split(c)
                    if split is None or split[1].leaves() & counters or not _quasi_affine(c, counters):
                        address = None
                        break
            beyond = frozenset(
                sym for loop, sym in values.counters.items()
                if loop is not values.info and address is not None and sym in address.leaves()
                and block not in values.facts.bodies[loop]
            )  # fmt: skip
            out.append(
                Access(op, op.name == "mem.store", op.attrs["bits"] // 8, address, op.attrs["offset"], beyond)
            )
    for a in out:
        if a.address is None:
            if a.store:
                raise Reject(f"store at {a.where} writes an address that is not affine in the loop counters")
            # A gather: its addresses are unknown before the launch, so the kernel checks
            # each one against the ranges the loop writes (see LoopPlan.gathers).
    return out


def _quasi_affine(sym, counters: set) -> bool:
    """A counter, or the floor of a value affine in the counters (an unrolled loop's
    ``i & -4``): isl models it exactly, the guards bound it."""
    if sym.kind != "floor":
        return True
    inner = sym.ref[0]
    for s in inner.symbols():
        if s.kind == "floor":
            return False
        if s in counters:
            split = inner.split(s)
            if split is None or split[1].leaves() & counters:
                return False
    return True
