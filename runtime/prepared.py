"""The prepared-module cache: what offload needs at run time, without the compiler's IR.

Preparing a module for offload (decode, translate, analyse, outline, rewrite) costs far
more than loading its kernels from the code cache, so the result is cached too, keyed like
the kernels (module hash, compiler fingerprint, target, options). An entry holds a
:class:`compiler.prepare.PreparedModule`: the rewritten module, the loop reports, the regions, and for each offloaded
loop its plan, kernel, insertion and host signature.

It is written as typed records (:mod:`tensorwasm.support.serial`), never pickled: reading
an entry builds only the classes of :data:`RECORDS`, through their constructors, so an
entry cannot name code to run. Plans point into the IR (values, ops, functions, loops);
each such reference is written as a small stand-in carrying only what the runtime reads (a
value's type, an op's offset, a function's name, a loop's offset and depth; a region, a
named tuple of its fields, so that reading one loads neither its module nor :mod:`dataclasses`), and the plan
fields only the outliner uses are dropped. An entry that cannot be read back whole (a
class not allowed, a record of another version, anything malformed) is None at load, and
then the module is simply prepared again.
"""

from __future__ import annotations

import sys

from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.compiler.prepare import PreparedModule
from tensorwasm.dialect.types import Type, by_name
from tensorwasm.support import logs
from tensorwasm.support.digest import sha256
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import record, replace
from tensorwasm.support.serial import Custom, Schema, SerialError

log = logs.get_logger(__name__)
# The IR's classes, needed only to write an entry: reading one (a warm start) needs no IR.
ir = LazyModule("tensorwasm.dialect.ir", globals(), "ir")
regions = LazyModule("tensorwasm.compiler.analysis.regions", globals(), "regions")


# The stand-ins are frozen records: every warm start defines them, and a record costs
# microseconds to define (a named tuple, ~0.1 ms).
@record(frozen=True)
class ValueRef:
    type: Type


@record(frozen=True)
class OpRef:
    name: str
    offset: int | None


@record(frozen=True)
class FunctionRef:
    name: str
    index: int


@record(frozen=True)
class LoopRef:
    offset: int
    depth: int
    start: int
    end: int


@record(frozen=True)
class RegionRef:
    """A device-resident region (:class:`compiler.analysis.regions.Region`, whose module a
    warm start need not load, with :mod:`dataclasses`): the same fields, read the same way."""

    func_index: int
    start: int
    end: int
    offset: int
    children: tuple[int, ...]
    exits: tuple[int, ...]


def _slim(plan: LoopPlan) -> LoopPlan:
    """A shallow copy without the fields only the outliner reads."""
    import copy  # (writing an entry only)

    out = copy.copy(plan)
    out.blocks, out.ivs, out.invariant_args, out.vector_ivs = set(), {}, {}, {}
    out.collapse = tuple(replace(level, blocks=set()) for level in plan.collapse)
    out.phases = tuple(
        replace(p, blocks=set(), grid_blocks=set(), exit=None, grid_exit=None) for p in plan.phases
    )
    return out


# Every class an entry may hold, by module: a record's fields are its own declarations,
# so a class that gains, loses or renames a field needs no change here, and one that moves
# or is added is a line. A module is imported only when an entry holds one of its classes.
RECORDS = Schema(
    {
        "tensorwasm.compiler.prepare": ("PreparedModule", "PreparedLoop"),
        "tensorwasm.compiler.analysis.plan": (
            "LoopPlan",
            "LoopReport",
            "TripCount",
            "Access",
            "Reduction",
            "ReductionKind",
            "LiveOut",
            "Collapse",
            "Phase",
            "AnalysisOptions",
        ),
        "tensorwasm.compiler.analysis.poly": ("Poly", "Symbol"),
        "tensorwasm.compiler.rewrite": ("Insertion", "Filter"),
        "tensorwasm.dialect.types": ("Type",),
        "tensorwasm.runtime.prepared": ("ValueRef", "OpRef", "FunctionRef", "LoopRef", "RegionRef"),
    },
    custom={
        "Poly": Custom(("terms",)),
        # A symbol's number orders the symbols of a monomial: kept, not drawn afresh.
        "Symbol": Custom(("kind", "ref", "name"), state=("order",)),
        # Types are interned: one is read back as the instance of its name.
        "Type": Custom(("name",), make=by_name),
    },
)


def _stand_in(obj: object) -> object:
    """What is written in place of ``obj``: a stand-in for an IR object, a plan slimmed
    (and once: the report and the loop that share a plan still share it when read back)."""
    if type(obj) is LoopPlan:
        return _slim(obj)
    if isinstance(obj, ir.Value):
        return ValueRef(obj.type)
    if isinstance(obj, ir.Op):
        return OpRef(obj.name, obj.offset)
    if isinstance(obj, ir.Function):
        return FunctionRef(obj.name, obj.index)
    if isinstance(obj, ir.LoopInfo):
        return LoopRef(obj.offset, obj.depth, obj.start, obj.end)
    if isinstance(obj, regions.Region):
        return RegionRef(obj.func_index, obj.start, obj.end, obj.offset, obj.children, obj.exits)
    if isinstance(obj, ir.Block):
        raise SerialError("a plan still refers to a block")
    return obj


class UnwritableError(SerialError):
    """A prepared module that holds something :data:`RECORDS` cannot write: the offload
    module catches it from :func:`dump` and goes on uncached."""


# An entry: this word, the SHA-256 of the rewritten module (which keys wasmtime's code for
# it: a warm start need not hash it), the length of the records' document (8 bytes, little
# endian), the document (the prepared module without its rewritten bytes), then those bytes
# as they are (in the document they would be base64, ~0.5 ms a warm start to decode).
MAGIC = b"TWP1"
_DIGEST = slice(len(MAGIC), len(MAGIC) + 32)
_LENGTH = slice(_DIGEST.stop, _DIGEST.stop + 8)


def dump(prepared: PreparedModule) -> bytes:
    """The prepared module as records, its IR references as stand-ins and its plans slimmed."""
    if not isinstance(prepared, PreparedModule):
        raise UnwritableError(f"not a prepared module: {type(prepared).__name__}")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # polynomials nest a little
    try:
        document = RECORDS.dumps(replace(prepared, rewritten=b""), _stand_in)
    except SerialError as exc:
        raise UnwritableError(str(exc)) from exc
    finally:
        sys.setrecursionlimit(limit)
    return entry(document, prepared.rewritten)


def entry(document: bytes, rewritten: bytes) -> bytes:
    """The cache entry of a records' document and the rewritten module's bytes."""
    digest = sha256(rewritten).digest()
    return b"".join((MAGIC, digest, len(document).to_bytes(8, "little"), document, rewritten))


def load(blob: bytes) -> PreparedModule | None:
    """The prepared module :func:`dump` wrote, or None (logged) where it cannot be read
    back whole: the module is then prepared again."""
    end = _LENGTH.stop + int.from_bytes(blob[_LENGTH], "little")
    if blob[: len(MAGIC)] != MAGIC or len(blob) < end:
        log.info("prepared-module cache entry unusable (not an entry of this release); preparing again")
        return None
    try:
        prepared = RECORDS.loads(blob[_LENGTH.stop : end])
    except SerialError as exc:  # an entry from another build: prepare afresh
        log.info("prepared-module cache entry unusable (%s); preparing again", exc)
        return None
    if not isinstance(prepared, PreparedModule):
        log.info("prepared-module cache entry unusable (not a prepared module); preparing again")
        return None
    return replace(prepared, rewritten=blob[end:])


def rewritten_digest(blob: bytes) -> str:
    """The SHA-256 (hex) of the rewritten module in the entry ``blob`` (one :func:`load` reads)."""
    return blob[_DIGEST].hex()
