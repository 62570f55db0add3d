"""Privatisable temporaries (compiler/analysis/privatise.py): PolyBench's doitgen computes
each (r, q) row into ``sum`` and copies it back, so every iteration writes the whole of
``sum``; no iteration reads what another wrote. The analysis names that, and keeps a
nest whose temporary has an upward-exposed read (or writes that do not run in every
iteration) sequential by proof. The nests run bit for bit as wasmtime runs them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis import loops
from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.induction import LoopValues
from tensorwasm.compiler.analysis.isl import NestModel
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.analysis.privatise import temporary_of
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_schedule import run

DATA = (Path(__file__).parent / "data" / "privatise.wasm").read_bytes()
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
KERNELS = ("doitgen", "exposed", "guarded")


def reports() -> dict:
    """(function name, loop depth) -> the report of the first loop at that depth."""
    out = {}
    for r in analyze_module(translate_module(load(DATA))):
        out.setdefault((r.func.name, r.loop.depth), r)
    return out


def test_doitgens_sum_is_recognised_as_privatisable_at_r_and_q():
    found = reports()
    for depth in (1, 2):
        r = found["doitgen", depth]
        assert r.verdict == "reject"
        assert r.reason.startswith("privatisable temporary:"), r.reason
        # The three stores of s_[p] (zeroed, then the sum kept at each of the s loop's two
        # unrolled steps) and the four unrolled loads of the copy.
        stores, loads = re.search(r"store\(s\) at ([^)]*)\).*load\(s\) at ([^)]*)\)", r.reason).groups()
        assert len(stores.split(", ")) == 3 and len(loads.split(", ")) == 4
    # The p loops inside still run one iteration per thread.
    assert found["doitgen", 3].verdict == "offload"


@pytest.mark.parametrize("name", ["exposed", "guarded"])
def test_an_upward_exposed_read_keeps_the_nest_sequential(name):
    """exposed: the copy reads s_[NP - 1], which the iteration never writes; guarded: the
    writes run only in the iterations whose row starts positive. Either way an iteration
    reads what an earlier one left."""
    found = reports()
    for depth in (1, 2):
        r = found[name, depth]
        assert r.verdict == "reject"
        assert r.reason.startswith("sequential: store at"), r.reason


def test_the_temporary_holds_exactly_the_accesses_of_sum(monkeypatch):
    """temporary_of on doitgen's r loop: the stores and loads at s_'s base, no access of a
    or c4; none for the store to a[r][q][p] (it moves with r)."""
    module = translate_module(load(DATA))
    func = next(f for f in module.functions if f.name == "doitgen")
    info = next(m for m in func.loops if m.depth == 1)
    seen = {}

    def modelled(values: LoopValues, trip, inner, accesses, settled):
        seen["model"] = NestModel(values, trip, inner, fixed=False)
        seen["accesses"] = accesses
        return []

    monkeypatch.setattr(loops, "exact_dependences", modelled)
    loops.plan_loop(FunctionLoops(module, func), info, AnalysisOptions())
    model, accesses = seen["model"], seen["accesses"]
    r = model.values.counter(info)
    stores = [n for n, a in enumerate(accesses) if a.store]
    copy = next(n for n in stores if r in accesses[n].address.leaves())
    first = next(n for n in stores if r not in accesses[n].address.leaves())
    temporary = temporary_of(model, accesses, first)
    assert temporary is not None
    assert len(temporary.stores) == 3 and len(temporary.loads) == 4
    for n in temporary.accesses:
        assert (accesses[n].address - accesses[first].address).leaves() <= model.counters
    assert copy not in temporary.accesses
    assert temporary_of(model, accesses, copy) is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KERNELS)
def test_the_nests_match_wasmtime(device, name):
    reference = ReferenceInstance(DATA)
    pointers = [(I32, reference.call(f, []).values[0][1]) for f in ("A_", "C4_", "sum_")]
    instance = run(device, [("init", []), (name, pointers), (name, pointers)], DATA)
    # Only the p loops inside the (r, q) nest launch: one arrival per (r, q) iteration.
    assert instance.offloaded > 0
