"""The loops family's shapes for privatised temporaries, mid-body exits, column updates and
split loops (``oracle.generators``: ``privatised``, ``midexit``, ``columns``, ``split``):
each draws valid modules that wasmtime runs, of the shape the analysis accepts (doitgen's
``sum`` privatised, a loop exiting halfway counted, a column loop guarded element by
element, atax's and bicg's loops split into parallel phases), its variants that must stay
sequential are refused, and a miscompile planted in what the shape is there for is
found by the fuzzer and shrunk to one kernel.

(``tests/oracle/test_shapes.py`` runs every shape of ``SHAPES`` offloaded, these three too.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorwasm.compiler.analysis import fission, privatise, trips
from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.trips import exits_mid_body
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.oracle import generators
from tensorwasm.oracle.case import Case
from tensorwasm.oracle.compare import run_case
from tensorwasm.oracle.fuzz import fuzz_generator
from tensorwasm.oracle.generators import ELEMENTS, SHAPES, Kernel, _loop_module, shaped_kernel
from tensorwasm.runtime import guards
from tensorwasm.runtime.reference import ReferenceInstance
from tests.oracle.test_oracle import SHRINK_SECONDS, mutant

NEW_SHAPES = ("privatised", "midexit", "columns", "split")
DRAWS = 40


def _draws(shape: str, count: int = DRAWS, **shape_args) -> list[Kernel]:
    """A fixed draw (the same every run) of ``count`` kernels of ``shape``."""
    kernels: list[Kernel] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(shaped_kernel("kernel0", 0, shape, **shape_args))
    def draw(kernel: Kernel) -> None:
        kernels.append(kernel)

    draw()
    return kernels


def _outermost(case: Case):
    """The analysis's report of the kernel's outermost loop."""
    reports = analyze_module(translate_module(load(case.wasm)))
    return next(r for r in reports if r.loop.depth == 1)


def test_the_new_shapes_are_drawn_by_the_loops_family() -> None:
    assert set(NEW_SHAPES) <= set(SHAPES)
    assert set(NEW_SHAPES) <= set(generators.SHAPE_STRATEGIES)


@pytest.mark.parametrize("shape", NEW_SHAPES)
def test_each_shape_makes_valid_modules_that_wasmtime_runs(shape: str) -> None:
    kernels = _draws(shape)
    assert {k[3]["shape"] for k in kernels} == {shape}
    calls = traps = 0
    for kernel in kernels:
        case = _loop_module([kernel])
        instance = ReferenceInstance(case.wasm)  # a module wasmtime validates and instantiates
        for call in case.calls:
            result = instance.call(call.func, list(call.args))
            assert result.error is None, (result.error, case.text())
            calls += 1
            traps += result.trap is not None
    # Trip counts that fit, overrun by one, 0, 1 or random: most calls run to their end.
    assert calls >= len(kernels) and traps < calls / 4, (traps, calls)


def test_doitgen_s_temporary_is_privatised_and_its_sequential_variants_refused() -> None:
    accepted = refused = 0
    for kernel in _draws("privatised", 100):
        meta = kernel[3]
        rows = meta["counts"][0]
        report = _outermost(_loop_module([kernel]))
        if meta["variant"] == "doitgen" and rows != "n" and rows > 1:
            assert report.verdict == "offload", report.reason
            assert "privatised: a copy per thread of 1 temporary array(s)" in report.reason, report.reason
            accepted += 1
        elif meta["variant"] != "doitgen" and rows != "n" and rows > 1:
            # exposed: the copy reads t[P - 1], never written; guarded: the writes do not run
            # in every iteration. Either way an iteration reads what an earlier one left: not
            # privatised; sequential, or stepped (the iterations in order, tests/compiler/test_stepped.py).
            assert "privatised" not in report.reason, (meta["variant"], report.reason)
            if report.verdict == "offload":
                assert report.plan.stepped, report.reason
            else:
                assert report.reason.startswith("sequential: "), report.reason
            refused += 1
        elif rows == "n":  # the last iteration, whose copy memory keeps, is not known: no copies
            assert "privatised" not in report.reason, report.reason
            if report.verdict == "offload":  # (stepped: the iterations in order, on memory itself)
                assert report.plan.stepped, report.reason
            else:
                assert "count is not a number" in report.reason, report.reason
    assert accepted >= 10 and refused >= 3, (accepted, refused)


@pytest.mark.parametrize("variant", ["atax", "bicg", "carried", "norm", "lu", "fw", "seidel", "gs"])
def test_atax_and_bicg_are_split_and_the_carried_and_norm_variants_stepped(variant: str) -> None:
    kernels = _draws("split", 20, variant=variant)
    assert {k[3]["variant"] for k in kernels} == {variant}
    for kernel in kernels:
        report = _outermost(_loop_module([kernel]))
        if variant == "gs":  # stepped; its column loop split: the sums over it, the updates over cells
            assert report.plan is not None and report.plan.stepped, report.reason
            phases = report.plan.phases
            assert [p.whole for p in phases] == [True, False, False, False], report.reason
            assert [p.inner is not None for p in phases] == [False, False, False, True], report.reason
            assert phases[2].grid is phases[3].grid, report.reason
            continue
        if variant == "lu":  # a wavefront from three rows (two: row 0 writes nothing, parallel)
            if kernel[3]["size"] > 2:
                assert report.plan is not None and report.plan.wave == ((1, 0), (2, 0)), report.reason
            continue
        if variant == "seidel":  # a wavefront in steps 2t + r, its tasks reloading u
            meta = kernel[3]
            vt, _, _, size = ELEMENTS[meta["buffers"][0]["element"]]
            whole = size * 8 == int(vt[1:])  # (an element as wide as its value: u stored whole)
            if meta["steps"] > 1 and meta["size"] > 3 and (meta["carried"] == "loaded" or whole):
                plan = report.plan
                assert plan is not None and plan.wave == ((2, 0),), report.reason
                ((_, index),) = plan.task_reloads
                assert plan.accesses[index].op.name == {"loaded": "mem.load", "stored": "mem.store"}[meta["carried"]]
            elif meta["carried"] == "stored" and not whole:  # a narrow store is no value carried
                assert report.plan is None or not report.plan.task_reloads, report.reason
            continue
        if variant == "fw":  # stepped, the row loop split at row k: below, at, above it
            assert report.plan is not None and report.plan.stepped, report.reason
            if kernel[3]["size"] > 2:  # (two rows: a wavefront, row k + 1 after row k's update)
                assert [(p.pivot, p.side) for p in report.plan.phases][::3] == [((1, 0, 1), s) for s in (-1, 0, 1)]
                assert all(p.inner is not None for p in report.plan.phases)  # a cell per element
            continue
        if variant in ("carried", "norm"):  # not split (the statement reads what earlier rows
            # wrote; the first loop's sum is read after it): stepped
            assert report.plan is not None and report.plan.stepped, report.reason
            assert [p.whole for p in report.plan.phases] == [True, False], report.reason
            assert "not split" not in report.reason and "stepped: each iteration runs 2 phase(s)" in report.reason
        else:
            assert report.plan is not None and report.plan.fission, report.reason
            assert len(report.plan.phases) == 2 and "split into 2 parallel phase(s)" in report.reason


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_gramschmidt_s_split_column_loop_matches_wasmtime(device: str) -> None:
    """The ``gs`` variant's kernels, of every element type and size, offloaded: the sums,
    then the updates as cells, give wasmtime's memory and results; their column loops ran
    split where the guards let them launch."""
    from tensorwasm.oracle.offload import OffloadInstance
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance

    split = 0
    for kernel in _draws("split", 12, variant="gs"):
        case = _loop_module([kernel])
        if device == "simulated":
            instance = SimulatedOffloadInstance(case.wasm)
        else:
            instance = OffloadInstance(case.wasm, device, pin=True)
        outcome = run_case(case, lambda wasm, instance=instance: instance)
        assert not outcome.failed, (outcome.mismatch, case.text())
        split += any(lp.stats.offloaded and any(p.inner is not None for p in lp.plan.phases)
                     for lp in instance.offload.loops)  # fmt: skip
    assert split >= 4, split  # (the others' buffers overlap, or sit misaligned for a GPU: declined)


def test_mid_exit_loops_are_counted_and_launched() -> None:
    offloaded = 0
    kernels = _draws("midexit")
    for kernel in kernels:
        case = _loop_module([kernel])
        module = translate_module(load(case.wasm))
        function = next(f for f in module.functions if f.name == "kernel0")
        facts = FunctionLoops(module, function)
        outer = kernel[3]["outer"]
        (mid,) = [info for info in function.loops if exits_mid_body(facts, info)]
        assert mid.depth == (1 if outer else 2)
        reports = analyze_module(module)
        offloaded += any(r.verdict == "offload" for r in reports)
    assert offloaded >= 0.75 * len(kernels), (offloaded, len(kernels))


def test_column_loops_launch_behind_guards_on_their_pointers() -> None:
    kernels = _draws("columns")
    meets = 0
    for kernel in kernels:
        meta = kernel[3]
        report = _outermost(_loop_module([kernel]))
        assert report.verdict == "offload", report.reason
        assert "guards" in report.reason, report.reason  # the pointers' columns compared at run time
        meets += bool(meta["meets"])
    assert 0 < meets < len(kernels)


# -- planted bugs ----------------------------------------------------------------------------


def _only(shape: str):
    @st.composite
    def kernel(draw: st.DrawFn, name: str, index: int) -> Kernel:
        return draw(shaped_kernel(name, index, shape))

    return kernel


def _planted_is_found(
    mp: pytest.MonkeyPatch, shape: str, owner, name: str, old: str, new: str, backend: str, tmp_path: Path,
    variant: str | None = None,
) -> None:  # fmt: skip
    """With ``owner.name`` planted, the loops family drawing only ``shape`` on ``backend``
    finds a failure, shrunk to one kernel (``variant``: one of that variant of the shape
    among them), saved so that it fails with the plant and passes without it."""
    mp.setenv("TENSORWASM_CACHE", "off")
    mp.setattr(generators, "_any_kernel", _only(shape))
    with mp.context() as planted:
        planted.setattr(owner, name, mutant(owner, name, old, new))
        report = fuzz_generator(
            "loops", backend, max_examples=300, seed=20240, shrink_seconds=SHRINK_SECONDS, save_dir=tmp_path
        )
        assert report.failures, f"the {shape} shape did not find the planted {owner.__name__}.{name}"
        shrunk = report.failures[0].case
        assert {k["shape"] for k in shrunk.meta["kernels"]} == {shape}
        if variant is None:
            assert shrunk.programs == 1, shrunk.text()
        else:
            assert variant in {k.get("variant") for k in shrunk.meta["kernels"]}, shrunk.text()
        replayed = Case.load(report.failures[0].saved)
        assert run_case(replayed, backend).failed
    assert not run_case(replayed, backend).failed


@pytest.mark.parametrize("backend", ["offload-cpu", "offload-sim"])
def test_a_temporary_privatised_where_its_writes_may_not_run_is_found(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Privatisation that forgets that a store under a condition may not run: the guarded
    variant's threads copy their own (unwritten) temporary where wasmtime copies what an
    earlier row left."""
    _planted_is_found(monkeypatch, "privatised", privatise, "_always_runs", "return False", "return True",
                      backend, tmp_path)  # fmt: skip


def test_a_wavefront_whose_steps_run_dependent_tasks_at_once_is_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A wavefront check that lets every schedule through, lu's tried with step ``k + t`` for
    both ``j`` loops alone: its second loop's tasks (``j = i + t``) then run before the first
    loop's of their row, which they read (the simulated device runs the steps in order, one
    task after another). Unplanted, that schedule is refused and the loop stays stepped."""
    monkeypatch.setattr(fission, "WAVE_SLOPES", (1,))
    _planted_is_found(monkeypatch, "split", fission, "_wave_relation", 'return (f"{apart} and',
                      'return (f"1 = 0 and {apart} and', "offload-sim", tmp_path)  # fmt: skip


def test_a_pivot_one_row_off_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pivot search that answers one task past the one it checked: floyd-warshall's row
    ``k`` then runs in the part below it, beside the rows that must read it before its
    update (the simulated device runs a part's odd tasks before its even ones, as a GPU's
    threads may, so the rows that read it after its update differ from wasmtime)."""
    _planted_is_found(monkeypatch, "split", fission, "_pivot_point", "return a, c, d", "return a, c + 1, d",
                      "offload-sim", tmp_path, variant="fw")  # fmt: skip


def test_a_task_reloading_its_own_address_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A reload at the task's own address instead of the previous task's: seidel-2d's row
    then sees its own first element, not the one the row before carried (the simulated
    device runs the wavefront's steps; the carried value differs from wasmtime's)."""
    _planted_is_found(monkeypatch, "split", fission, "reload_access", "(Poly.symbol(k) - Poly.const(1))",
                      "(Poly.symbol(k) - Poly.const(0))", "offload-sim", tmp_path, variant="seidel")  # fmt: skip


@pytest.mark.parametrize("backend", ["offload-cpu", "offload-sim"])
def test_a_mid_exit_loop_counted_as_tested_at_its_top_is_found(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A loop whose test is halfway counted as if the test were at its top: one run of the
    header short, so the last iteration's first half is missing."""
    _planted_is_found(monkeypatch, "midexit", trips, "_exit_test", "return cmp, stays, False, True",
                      "return cmp, stays, True, False", backend, tmp_path)  # fmt: skip


@pytest.mark.gpu
def test_a_column_guard_that_misses_a_shared_element_is_found_on_the_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The element-by-element comparison of footprints answering "apart" always: a column of
    ``a`` passed again as ``b`` is read by every thread while one writes it. (The host backend
    and the simulated device run a launch's iterations in order, which hides the race.)"""
    _planted_is_found(
        monkeypatch, "columns", guards, "_elements_meet",
        "return _in_window(s.origin - a.origin, dims, s.element, a.element, False, [SEARCH_BUDGET])",
        "return False", "offload-gpu", tmp_path,
    )  # fmt: skip
