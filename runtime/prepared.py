"""The prepared-module cache: what offload needs at run time, without the compiler's IR.

Preparing a module for offload (decode, translate, analyse, outline, rewrite) costs far
more than loading its kernels from the code cache, so the result is cached too, keyed like
the kernels (module hash, compiler fingerprint, target, options). An entry holds a
:class:`compiler.prepare.PreparedModule`: the rewritten module, the loop reports, the
regions, and for each offloaded loop its plan, kernel, insertion and host signature.
Plans point into the IR (values, ops, blocks, functions, loops); here each such reference
is pickled as a small stand-in carrying only what the runtime reads (a value's type, an
op's offset, a function's name, a loop's offset and depth), and the plan fields only the
outliner uses are dropped. An entry that cannot be read back whole (a stand-in that a
later runtime change would need, a record of another version) is None at load, and then
the module is simply prepared again.
"""

from __future__ import annotations

import copy
import io
import pickle
import sys
from typing import NamedTuple

from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.compiler.prepare import PreparedModule
from tensorwasm.dialect.types import Type

from tensorwasm.support import logs
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import replace

log = logs.get_logger(__name__)
# The IR's classes, needed only to write an entry: reading one (a warm start) needs no IR.
ir = LazyModule("tensorwasm.dialect.ir", globals(), "ir")


# The stand-ins are named tuples: every warm start defines them, and a named tuple costs a
# fifth of what a frozen dataclass does to define.
class ValueRef(NamedTuple):
    type: Type


class OpRef(NamedTuple):
    name: str
    offset: int | None


class FunctionRef(NamedTuple):
    name: str
    index: int


class LoopRef(NamedTuple):
    offset: int
    depth: int
    start: int
    end: int


def _slim(plan: LoopPlan) -> LoopPlan:
    """A shallow copy without the fields only the outliner reads."""
    out = copy.copy(plan)
    out.blocks, out.ivs, out.invariant_args = set(), {}, {}
    out.collapse = tuple(replace(level, blocks=set()) for level in plan.collapse)
    return out


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object):
        if isinstance(obj, ir.Value):
            return ("value", obj.type)
        if isinstance(obj, ir.Op):
            return ("op", obj.name, obj.offset)
        if isinstance(obj, ir.Function):
            return ("func", obj.name, obj.index)
        if isinstance(obj, ir.LoopInfo):
            return ("loop", obj.offset, obj.depth, obj.start, obj.end)
        if isinstance(obj, ir.Block):
            raise pickle.PicklingError("a plan still refers to a block")
        return None

    def reducer_override(self, obj: object):
        # A plan is written slimmed, and once: pickle remembers the plan itself, so the
        # report and the loop that share it still share it when read back.
        if type(obj) is LoopPlan:
            return _slim(obj).__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    _REFS = {"value": ValueRef, "op": OpRef, "func": FunctionRef, "loop": LoopRef}

    def persistent_load(self, pid):
        kind, *fields = pid
        return self._REFS[kind](*fields)


def dump(prepared: PreparedModule) -> bytes:
    """The prepared module pickled, its IR references as stand-ins and its plans slimmed."""
    buffer = io.BytesIO()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # polynomials nest a little
    try:
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(prepared)
    finally:
        sys.setrecursionlimit(limit)
    return buffer.getvalue()


def load(blob: bytes) -> PreparedModule | None:
    """The prepared module :func:`dump` wrote, or None (logged) where it cannot be read
    back whole: the module is then prepared again."""
    try:
        prepared = _Unpickler(io.BytesIO(blob)).load()
    except Exception as exc:  # an entry from another build: prepare afresh
        log.info("prepared-module cache entry unusable (%s); preparing again", exc)
        return None
    if isinstance(prepared, dict):  # OffloadModule's own state, until it builds on compiler.prepare
        return prepared
    if not _whole(prepared):
        log.info("prepared-module cache entry unusable (not a whole PreparedModule); preparing again")
        return None
    return prepared


def _whole(prepared: object) -> bool:
    """Whether ``prepared`` is a PreparedModule whose records all have every field of
    their classes (an entry written by another version of them has not)."""
    if not isinstance(prepared, PreparedModule) or not _has_fields(prepared):
        return False
    return all(
        _has_fields(lp) and _has_fields(lp.plan) and _has_fields(lp.insertion) for lp in prepared.loops
    )


def _has_fields(obj: object) -> bool:
    return set(type(obj).__record_fields__) <= vars(obj).keys()
