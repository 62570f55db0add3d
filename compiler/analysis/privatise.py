"""Privatisable temporaries: memory every iteration of a loop writes before it reads it.

PolyBench's doitgen computes each ``(r, q)`` row into a scratch array ``sum`` and copies
it back: every iteration writes the whole of ``sum``, so the iterations' stores meet, and
the exact dependences (:mod:`.isl`) prove the loop sequential. But no iteration reads
what another wrote: within one iteration every element of ``sum`` that is read was
written earlier in that same iteration (no *upward-exposed* read). The only dependences
across iterations are then output and anti dependences, which vanish when each iteration
works on its own copy of the array (privatisation, as Polly and PPCG do it); after the
loop the array holds what the last iteration wrote.

A *temporary* is the set of accesses apart from one store by counters only (the same
base: same live-ins and constants), none of which moves with the candidate's counter
``k``, all affine in the nest. It is privatisable when, on the nest's polyhedral model
(:class:`.isl.NestModel`):

- it is read (an array only written is the loop's output, not a temporary), and every
  load of it, at every iteration of the loops around it, reads exactly the bytes
  that a store of it wrote earlier in the same iteration of ``k`` (same address and
  width; *earlier*: lexicographically smaller counters of the loops around both, or the
  same and the store first in the code, which in structured Wasm is the order they run
  in);
- every store of it runs in every iteration of the loops around it (its block dominates
  their latches; each inner loop's domain is exact: tested at its top, or a count that is
  a number of at least one), so the model's iterations are the ones that run, and the
  loop's last iteration writes every byte any iteration writes;
- no inner loop's bounds around it move with ``k``, so every iteration writes the same
  bytes and the last one's copy is what the array holds afterwards.

Accesses of other arrays apart from the temporary by live-ins (base pointers) are the
runtime guards' business, as any such pair is.

The kernel then gives each thread a copy of its own (:class:`.plan.Privatised`,
:func:`private_copy`): every access of the temporary reads and writes one element type at
its full width, the counters around them run counts that are numbers (the copy's size is
one), and the copy is at most :data:`PRIVATE_BYTES`. The thread of the candidate's last
iteration (its count is a number too) works on memory itself, so memory ends as the
sequential loop leaves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject
from tensorwasm.compiler.analysis.isl import NestModel, _context, _NotAffine, constant_count, isl
from tensorwasm.compiler.analysis.plan import Privatised
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.dialect.types import F32, F64, I32, I64
from tensorwasm.support.records import record

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.compiler.analysis.plan import Access, TripCount
    from tensorwasm.dialect.ir import LoopInfo


# The largest copy a thread keeps (local memory on the GPU, the stack on the host). The
# driver reserves a thread's local memory for every thread the GPU can hold at once (an
# H100: 132 SMs of 2048 threads), so 4 KiB a thread is about 1.1 GB of device memory.
PRIVATE_BYTES = 4 * 1024


@record(frozen=True)
class Temporary:
    """A privatisable temporary of a loop: indices into its plan's accesses."""

    stores: tuple[int, ...]
    loads: tuple[int, ...]

    @property
    def accesses(self) -> tuple[int, ...]:
        return tuple(sorted(self.stores + self.loads))


def temporary_of(model: NestModel, accesses: list[Access], store: int) -> Temporary | None:
    """The privatisable temporary that the store ``accesses[store]`` writes, or None where
    it is not one (or something about it is not modelled)."""
    k = model.values.counter(model.info)
    base = accesses[store]
    if base.address is None:
        return None
    members = []
    for n, access in enumerate(accesses):
        if access.address is None:
            return None  # a gather or a scatter may read or write the temporary anywhere
        if (access.address - base.address).leaves() - model.counters:
            continue  # another base: the guards keep them apart
        members.append(n)
    for n in members:
        access = accesses[n]
        if access.beyond or k in access.address.leaves() or not _fixed_domain(model, access, k):
            return None
    stores = tuple(n for n in members if accesses[n].store)
    loads = tuple(n for n in members if not accesses[n].store)
    if not loads:
        # Written only: an output, not a temporary; if the same array is read through
        # another live-in (clang's B + 8 beside B), only the guards could see it, and a loop
        # whose every iteration writes the same addresses is better proven sequential
        # (a time loop: a device-resident region).
        return None
    writers = [accesses[n] for n in stores]
    if not all(_always_runs(model, store) for store in writers):
        # (a store that runs in some iterations only leaves memory as the last iteration
        # that ran it wrote: not necessarily the loop's last iteration)
        return None
    try:
        for n in loads:
            if not _covered(model, accesses[n], writers):
                return None
    except (_NotAffine, isl.Error):
        return None
    return Temporary(stores, loads)


def _fixed_domain(model: NestModel, access: Access, k: object) -> bool:
    """The loops around ``access`` are the candidate and inner loops whose bounds do not
    move with the candidate's counter."""
    loops = model.loops_around(access)
    if not loops or loops[0] is not model.info:
        return False
    for loop in loops[1:]:
        trip = model.trips[model.values.counter(loop)]
        if k in trip.start.leaves() | trip.bound.leaves():
            return False
    return True


def _always_runs(model: NestModel, access: Access) -> bool:
    """``access`` runs at every point of its domain in the model: its block dominates the
    latches of every loop around it, and each inner loop's domain is exact."""
    facts = model.values.facts
    block = access.op.block
    for loop in model.loops_around(access):
        if not all(facts.dominates(block, latch) for latch in facts.latches[loop]):
            return False
        if loop is model.info:
            continue
        trip = model.trips[model.values.counter(loop)]
        if not trip.top and (constant_count(trip) or 0) < 1:
            return False
    return True


def _covered(model: NestModel, load: Access, writers: list[Access]) -> bool:
    """Every iteration of ``load`` reads bytes a store of ``writers`` wrote earlier in the
    same iteration of the candidate loop."""
    outer_l = model.loops_around(load)
    domain_l = _domain(model, outer_l, "y")
    variables = [model.var(m, "y") for m in outer_l]
    addr_l = model.affine(load.address, "y")
    parts = []
    for store in writers:
        if store.width != load.width:
            continue
        outer_s = model.loops_around(store)
        common = []
        for a, b in zip(outer_s, outer_l, strict=False):
            if a is not b:
                break
            common.append(a)
        same = [f"{model.var(m, 'x')} = {model.var(m, 'y')}" for m in common]
        # Earlier in the same iteration of the candidate (common[0]): a smaller counter of
        # a common inner loop, the ones outside it equal; or all equal and first in the code.
        earlier = [" and ".join([*same[:n], f"{model.var(common[n], 'x')} < {model.var(common[n], 'y')}"])
                   for n in range(1, len(common))]  # fmt: skip
        if store.op.offset is not None and load.op.offset is not None and store.op.offset < load.op.offset:
            earlier.append(" and ".join(same))
        if not earlier:
            continue
        xs = [model.var(m, "x") for m in outer_s]
        cons = _domain(model, outer_s, "x")
        before = " or ".join(f"({e})" for e in earlier)
        addr_s = model.affine(store.address, "x")
        parts.append(
            f"exists ({', '.join(xs)}: {' and '.join(cons)} and {same[0]} and ({before}) "
            f"and ({addr_s}) = ({addr_l}))"
        )
    if not parts:
        return False
    params = sorted(set(model.params.values()) | {"T"} | _counts(model, outer_l, writers))
    head = f"[{', '.join(params)}] -> {{ [{', '.join(variables)}] : {' and '.join(domain_l)}"
    context = _context()
    context.reset_operations()
    reads = isl.Set(head + " }", context=context)
    written = isl.Set(f"{head} and ({' or '.join(parts)}) }}", context=context)
    return reads.is_subset(written)


def _domain(model: NestModel, loops: list[LoopInfo], prefix: str) -> list[str]:
    """:meth:`NestModel.constraints`, with the count of an inner loop that is a number (PolyBench's
    sizes) in place of its free count: whether a write covers a read depends on both loops' counts."""
    out = model.constraints(loops, prefix)
    for n, loop in enumerate(loops):
        count = constant_count(model.trips[model.values.counter(loop)])
        name = f"N{model.names[model.values.counter(loop)]}"
        if loop is not model.info and count is not None and out[n].endswith(f"< {name}"):
            out[n] = out[n][: -len(name)] + str(count)
    return out


def _counts(model: NestModel, loops: list[LoopInfo], writers: list[Access]) -> set[str]:
    """The free counts ``N...`` the domains of ``loops`` and of the writers' loops name."""
    out = set()
    for loop in loops + [m for w in writers for m in model.loops_around(w)]:
        if loop is model.info:
            continue
        trip = model.trips[model.values.counter(loop)]
        if (
            not ((trip.start.leaves() | trip.bound.leaves()) & model.counters)
            and constant_count(trip) is None
        ):
            out.add(f"N{model.names[model.values.counter(loop)]}")
    return out


def private_copy(
    model: NestModel, accesses: list[Access], temporary: Temporary, trip: TripCount
) -> Privatised:
    """The copy each thread keeps of ``temporary``; :class:`Reject` naming what the kernel
    cannot do with it."""
    if constant_count(trip) is None:
        raise Reject(
            "privatisable temporary in a loop whose count is not a number (its last iteration is not known)"
        )
    members = [accesses[n] for n in temporary.accesses]
    widths = {_value_type(a).bits // 8 for a in members} | {a.width for a in members}
    if len(widths) != 1 or any(_value_type(a) not in (I32, I64, F32, F64) for a in members):
        raise Reject("privatisable temporary read or written in pieces of more than one size")
    (width,) = widths
    first = members[0].address
    # The base every access shares (live-ins, no counter), the constant apart.
    origin = Poly({m: c for m, c in first.terms.items() if m and not _moves(m, model)})
    lo = hi = None
    for access in members:
        rel = access.address - origin  # counters and a constant (the same base)
        low = high = rel.constant
        for monomial, coeff in rel.terms.items():
            if not monomial:
                continue
            (counter,) = monomial if len(monomial) == 1 else (None,)
            count = constant_count(model.trips[counter]) if counter in model.trips else None
            if count is None or count < 1 or coeff % width:
                raise Reject(
                    "privatisable temporary at an address that moves with a loop whose count is not "
                    "a number, or not by whole elements"
                )
            low, high = low + min(0, coeff * (count - 1)), high + max(0, coeff * (count - 1))
        lo = low if lo is None else min(lo, low)
        hi = high if hi is None else max(hi, high)
    if any((a.address - origin).constant % width != lo % width for a in members):
        raise Reject("privatisable temporary not read and written by whole elements")
    size = hi + width - lo
    if size > PRIVATE_BYTES:
        raise Reject(
            f"privatisable temporary of {size} bytes: a thread's copy may be at most {PRIVATE_BYTES}"
        )
    # Its elements are integers of the accesses' width: a float access reinterprets the bits.
    return Privatised(temporary.accesses, origin + Poly.const(lo), I64 if width == 8 else I32, size // width)


def _moves(monomial: tuple, model: NestModel) -> bool:
    """Whether a monomial holds a counter of the nest."""
    return any(s.leaves() & model.counters for s in monomial)


def _value_type(access: Access) -> object:
    """The type an access reads or writes."""
    op = access.op
    return op.operands[1].type if access.store else op.results[0].type


def private_copies(
    values: LoopValues, trip: TripCount, inner: list, accesses: list[Access], temporaries: list[Temporary]
) -> list[Privatised]:
    """The copies of ``temporaries`` (:func:`private_copy`), for the plan."""
    if not temporaries:
        return []
    model = NestModel(values, trip, inner, fixed=False)
    return [private_copy(model, accesses, t, trip) for t in temporaries]
