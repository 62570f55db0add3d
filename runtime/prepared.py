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

import json
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
        replace(p, blocks=set(), grid_blocks=set(), exit=None, grid_exit=None, skip={},
                inner=p.inner and replace(p.inner, blocks=set()))
        for p in plan.phases
    )  # fmt: skip
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
            "Privatised",
            "AnalysisOptions",
        ),
        "tensorwasm.compiler.analysis.poly": ("Poly", "Symbol"),
        "tensorwasm.compiler.rewrite": ("Insertion", "Filter"),
        "tensorwasm.dialect.types": ("Type",),
        "tensorwasm.runtime.prepared": (
            "ValueRef",
            "OpRef",
            "FunctionRef",
            "LoopRef",
            "RegionRef",
            "PlanRef",
        ),
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
# it: a warm start need not hash it), then three parts, each its length (8 bytes, little
# endian) and its bytes: the records' document of the prepared module without its reports
# and rewritten bytes; the reports' rows for the offload report, as plain JSON (read by
# the C parser alone); the reports' own document, parsed and built only where a run asks for
# them (a hundred reports are half the records a warm start would build; parsing them alone
# was 5% of a warm start's preparation). Then the rewritten
# module's bytes as they are (in a document they would be base64, ~0.5 ms to decode).
MAGIC = b"TWP2"
_DIGEST = slice(len(MAGIC), len(MAGIC) + 32)
_PARTS = 3


@record(frozen=True)
class PlanRef:
    """In the reports' document: the plan of the prepared module's offloaded loop ``index``
    (the report and the loop share it, read back as written)."""

    index: int


# A report's row: its function's name, the loop's offset and depth, the verdict, the reason,
# and the index of the offloaded loop it reports on (None: no loop of its own).
ReportRow = tuple[str, int, int, str, str, "int | None"]


def dump(prepared: PreparedModule) -> bytes:
    """The prepared module as records, its IR references as stand-ins and its plans slimmed."""
    if not isinstance(prepared, PreparedModule):
        raise UnwritableError(f"not a prepared module: {type(prepared).__name__}")
    index = {id(lp.plan): k for k, lp in enumerate(prepared.loops)}

    def in_reports(obj: object) -> object:
        found = index.get(id(obj)) if type(obj) is LoopPlan else None
        return PlanRef(found) if found is not None else _stand_in(obj)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # polynomials nest a little
    try:
        document = RECORDS.dumps(replace(prepared, rewritten=b"", reports=()), _stand_in)
        reports = RECORDS.dumps(tuple(prepared.reports), in_reports)
    except SerialError as exc:
        raise UnwritableError(str(exc)) from exc
    finally:
        sys.setrecursionlimit(limit)
    rows = json.dumps([_row(r, index) for r in prepared.reports], separators=(",", ":")).encode()
    return entry([document, rows, reports], prepared.rewritten)


def _row(report, index: dict[int, int]) -> list:
    loop = index.get(id(report.plan)) if report.plan is not None else None
    return [report.func.name, report.loop.offset, report.loop.depth, report.verdict, report.reason, loop]


def entry(parts: list[bytes], rewritten: bytes) -> bytes:
    """The cache entry of its three parts (see :data:`MAGIC`) and the rewritten module's bytes."""
    digest = sha256(rewritten).digest()
    return b"".join((MAGIC, digest, *(len(p).to_bytes(8, "little") + p for p in parts), rewritten))


class Entry:
    """A prepared-module entry read back: the module without its reports at once
    (:attr:`module`), its reports' rows (:attr:`rows`), the reports themselves when asked
    (:meth:`reports`)."""

    def __init__(self, module: PreparedModule, rows: list[ReportRow], reports: bytes, digest: str) -> None:
        self.module = module
        self.rows = rows
        self._reports = reports  # the reports' document, parsed only where a run asks for them
        self.rewritten_digest = digest  # the SHA-256 (hex) of module.rewritten

    def reports(self, plans: list) -> list:
        """The reports, each offloaded loop's with ``plans[k]``, its loop's plan (SerialError
        where the part cannot be read back whole)."""
        found = RECORDS.loads(self._reports)
        if type(found) is not tuple:
            raise SerialError("the reports are not a tuple")
        try:
            for report in found:
                if isinstance(report.plan, PlanRef):
                    report.plan = plans[report.plan.index]
        except (AttributeError, IndexError, TypeError) as exc:
            raise SerialError(f"the reports are malformed: {exc!r}") from exc
        return list(found)


def read(blob: bytes) -> Entry | None:
    """The entry :func:`dump` wrote, its reports not yet built; None (logged) where it cannot
    be read back whole: the module is then prepared again."""
    try:
        return _read(blob)
    except (SerialError, ValueError, TypeError) as exc:  # an entry from another build: prepare afresh
        log.info("prepared-module cache entry unusable (%s); preparing again", exc)
        return None


def _read(blob: bytes) -> Entry:
    if blob[: len(MAGIC)] != MAGIC:
        raise SerialError("not an entry of this release")
    parts, at = [], _DIGEST.stop
    for _ in range(_PARTS):
        end = at + 8 + int.from_bytes(blob[at : at + 8], "little")
        if len(blob) < end:
            raise SerialError("an entry cut short")
        parts.append(blob[at + 8 : end])
        at = end
    document, rows, reports = parts
    module = RECORDS.loads(document)
    if not isinstance(module, PreparedModule):
        raise SerialError("not a prepared module")
    rows = json.loads(rows)
    if type(rows) is not list or any(type(row) is not list or len(row) != 6 for row in rows):
        raise SerialError("the reports' rows are not rows")
    return Entry(replace(module, rewritten=blob[at:]), rows, reports, blob[_DIGEST].hex())


def load(blob: bytes) -> PreparedModule | None:
    """The prepared module :func:`dump` wrote, reports included, or None (logged) where it
    cannot be read back whole: the module is then prepared again."""
    found = read(blob)
    if found is None:
        return None
    try:
        reports = found.reports([lp.plan for lp in found.module.loops])
    except SerialError as exc:
        log.info("prepared-module cache entry unusable (%s); preparing again", exc)
        return None
    return replace(found.module, reports=tuple(reports))
