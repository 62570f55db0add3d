"""Wavefronts (compiler/analysis/fission.py's split_wavefront, compiler/lower/phases.py's
wavefront entry): a stepped loop whose serial work runs in child loops, PolyBench's lu,
launched once as steps ``w = m * k + t`` of tasks (one iteration of a child loop at one
iteration of the loop each), the whole grid waiting after each step. isl must order every
task after those it reads; results bit for bit wasmtime's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis import fission
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule

DATA = (Path(__file__).parent / "data" / "wavefront.wasm").read_bytes()


def _calls() -> list[tuple[str, list]]:
    a = ReferenceInstance(DATA).call("addr", [(I32, 0)]).values[0][1]
    return [("init", []), ("lu", [(I32, a)])]


def test_lu_runs_in_steps_i_plus_j():
    report = schedule.outer_reports(DATA)["lu"]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped and plan.fission, report.reason
    # Row i's j < i loop (j = t) and its j >= i loop (j = i + t): both in step i + j.
    assert plan.wave == ((1, 0), (2, 0))
    left, right = plan.phases
    assert not left.whole and not right.whole and left.grid.offset < right.grid.offset
    assert left.stores | right.stores == {i for i, a in enumerate(plan.accesses) if a.store}
    # Each phase's task: one iteration of its j loop, with the k loop inside at its largest.
    assert len(plan.task_work) == 2 and all(plan.task_work)
    assert "wavefront: 2 phase(s), a task per grid iteration" in report.reason
    # clang's remainder of the k loop unrolled by two, run where the count is odd, is
    # modelled: no gathered load is left to check in the kernel.
    assert not plan.gathers


def test_a_schedule_that_runs_dependent_tasks_at_once_is_refused(monkeypatch):
    """In step ``w = t`` the tasks (i, j) of every row would run at once, row i reading what
    row i - 1 writes: isl finds the pair and the loop stays stepped, its j < i loop on one
    thread."""
    monkeypatch.setattr(fission, "WAVE_SLOPES", (0,))
    report = schedule.outer_reports(DATA)["lu"]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped and not plan.wave, report.reason
    assert any(p.whole for p in plan.phases)


def test_the_host_backend_runs_no_wavefront():
    module = translate_module(load(DATA))
    host = analyze_module(module, AnalysisOptions(distribute=False, stepped=False))
    assert not any(r.plan is not None and (r.plan.stepped or r.plan.wave) for r in host)


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_wavefront_lu_matches_wasmtime(device):
    instance = schedule.run(device, _calls() * 2, DATA)
    lp = schedule.outer_loop(instance.offload.loops, "lu")
    assert lp.plan.wave and lp.stats.offloaded == 2, lp.stats.declined


def test_wavefront_kernels_assemble_for_sm_90_with_a_barrier_per_step(ptxas: str, tmp_path: Path) -> None:
    module = translate_module(load(DATA))
    plans = [r.plan for r in analyze_module(module) if r.plan is not None and r.plan.wave]
    assert [p.func.name for p in plans] == ["lu"]
    (body,) = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    # One grid barrier per step (two atomic adds), the flags set and read with relaxed
    # device-wide accesses.
    assert body.count("atom.") == 2 and body.count("barrier.sync") == 2
    assert "tw_wave_flags_" in body
    # clang stores A[i][j] in every step of the k loops; isl proved no load of a task meets
    # it (``task_apart``), which the kernel tells LLVM: it keeps the sums in registers.
    module = translate_module(load(DATA))
    plans = [r.plan for r in analyze_module(module) if r.plan is not None and r.plan.wave]
    for plan in plans:
        plan.task_apart = frozenset()
    (unmarked,) = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    assert body.count("st.global") + 2 <= unmarked.count("st.global")


def test_the_k_loops_loads_never_meet_the_store_of_their_task():
    plan = schedule.outer_reports(DATA)["lu"].plan
    apart = {(plan.accesses[i].where, plan.accesses[j].where) for i, j in plan.task_apart}
    for store in plan.accesses:
        if not store.store or not any((store.where, a.where) in apart for a in plan.accesses):
            continue
        same = [a for a in plan.accesses if a.address == store.address and a is not store]
        # The load of A[i][j] before the k loop, and the other stores of A[i][j], do meet it.
        assert same and not any((store.where, a.where) in apart for a in same)
    assert len(apart) >= 8
