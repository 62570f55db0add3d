"""Privatised temporaries (compiler/analysis/privatise.py, compiler/outline.py): PolyBench's
doitgen computes each (r, q) row into ``sum`` and copies it back, so every iteration writes
the whole of ``sum``, and no iteration reads what another wrote. The (r, q) nest runs as a
2-D grid, each thread on a copy of ``sum`` of its own, the last iteration's thread on
memory; a nest whose temporary has an upward-exposed read (or writes that do not run in
every iteration) stays sequential by proof. The nests run bit for bit as wasmtime runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis import loops, privatise
from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.induction import LoopValues
from tensorwasm.compiler.analysis.isl import NestModel
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.analysis.privatise import temporary_of
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32, I64
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.compiler.test_schedule import run

DATA = (Path(__file__).parent / "data" / "privatise.wasm").read_bytes()
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
KERNELS = ("doitgen", "exposed", "guarded")
NP = 32


def reports() -> dict:
    """(function name, loop depth) -> the report of the first loop at that depth."""
    out = {}
    for r in analyze_module(translate_module(load(DATA))):
        out.setdefault((r.func.name, r.loop.depth), r)
    return out


def test_doitgens_sum_is_privatised_and_the_r_q_nest_is_one_2d_launch():
    found = reports()
    for depth in (1, 2):
        r = found["doitgen", depth]
        assert r.verdict == "offload", r.reason
        assert "privatised: a copy per thread of 1 temporary array(s) (256 bytes)" in r.reason, r.reason
        (copy,) = r.plan.private
        # s_[p] zeroed, then the sum kept at each of the s loop's two unrolled steps; the
        # copy's four unrolled loads. The copy: NP doubles as i64 bits, from s_ itself.
        kinds = sorted(r.plan.accesses[n].kind for n in copy.accesses)
        assert kinds == ["load"] * 4 + ["store"] * 3
        assert copy.type is I64 and copy.count == NP
        assert not copy.base.constant and len(copy.base.terms) == 1
        # Each thread's own copy: the guards compare no pair among its accesses.
        assert {(i, j) for i in copy.accesses for j in copy.accesses if r.plan.accesses[i].store} <= set(
            r.plan.static_dependence_free
        )
        assert not r.plan.phases  # (a distributed body would share an iteration's copy)
    assert "2-D grid with the loop at" in found["doitgen", 1].reason
    assert found["doitgen", 1].plan.collapse[0].loop is found["doitgen", 2].loop


def test_a_copy_larger_than_a_thread_may_keep_is_declined_by_name(monkeypatch):
    monkeypatch.setattr(privatise, "PRIVATE_BYTES", 8 * NP - 8)
    r = reports()["doitgen", 1]
    assert r.verdict == "reject"
    assert (
        r.reason == f"privatisable temporary of {8 * NP} bytes: a thread's copy may be at most {8 * NP - 8}"
    )


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
        assert not r.plan


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
        return [], []

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
    """Each call's memory (``a``, and ``s_`` as the last (r, q) iteration leaves it) equals
    wasmtime's, bit for bit; doitgen's nest launches once per call, the others' p loops
    once per (r, q) iteration."""
    reference = ReferenceInstance(DATA)
    pointers = [(I32, reference.call(f, []).values[0][1]) for f in ("A_", "C4_", "sum_")]
    instance = run(device, [("init", []), (name, pointers), (name, pointers)], DATA)
    launched = {
        lp.plan.loop.depth: lp.stats.offloaded for lp in instance.offload.loops if lp.plan.func.name == name
    }
    if name == "doitgen":
        assert launched[1] == 2 and launched[3] == 0
    else:
        assert 1 not in launched and 2 not in launched and launched[3] > 0


def test_the_private_copy_is_local_memory_and_assembles(ptxas, tmp_path):
    """On the GPU the copy is the thread's own (local memory, ``.local``), not block-shared."""
    module = translate_module(load(DATA))
    plans = [r.plan for r in analyze_module(module) if r.plan is not None and r.plan.private]
    assert plans
    ptx = plans_ptx(module, plans, "sm_90")
    assemble(ptxas, ptx, "sm_90", tmp_path)
    assert ".local" in ptx and ".shared" not in ptx
