"""The oracle has teeth: planted miscompiles are found and shrunk by every generator family,
and the unmodified compiler passes a few hundred cases of each on the host backend.

A planted bug is a lowering helper recompiled from its own source with one edit (so the
test breaks loudly if the helper changes shape), swapped in with monkeypatch.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tensorwasm.compiler.lower import control, convert, function, memory, numeric
from tensorwasm.dialect.types import F32, I32
from tensorwasm.oracle.case import Call, Case
from tensorwasm.oracle.compare import run_case, same_value
from tensorwasm.oracle.fuzz import fuzz, fuzz_generator
from tensorwasm.oracle.generators import BATCH, GENERATORS, const_text, numeric_ops
from tensorwasm.runtime.executor import HostExecutor

SHRINK_SECONDS = 300.0  # a bound, not a cost: shrinking stops once the case is minimal (a slow machine must get there too)


def mutant(owner, name: str, old: str, new: str):
    """``owner.name`` (a module's function, or a class's method) recompiled with ``old``
    replaced by ``new`` in its source."""
    module = owner if inspect.ismodule(owner) else sys.modules[owner.__module__]
    source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
    assert old in source, f"{owner.__name__}.{name} changed: update the planted bug"
    namespace = dict(vars(module))
    exec(
        compile("from __future__ import annotations\n" + source.replace(old, new), module.__file__, "exec"),
        namespace,
    )
    return namespace[name]


def plant_shift_mask(mp: pytest.MonkeyPatch) -> None:
    """Shift counts masked with the width instead of width - 1."""
    mp.setattr(numeric, "shift_count_mask", mutant(numeric, "shift_count_mask", "width - 1", "width"))


def plant_min_max_nan(mp: pytest.MonkeyPatch) -> None:
    """min/max that forget NaN propagation (what PTX min.f32 does)."""
    wrong = mutant(numeric, "wasm_min_max", "return b.select(nan, b.fadd(a, c), picked)", "return picked")
    mp.setattr(numeric, "wasm_min_max", wrong)


def plant_trunc_sat_nan(mp: pytest.MonkeyPatch) -> None:
    """trunc_sat without its NaN -> 0 case."""
    wrong = mutant(
        convert,
        "lower_saturating_truncation",
        "return b.select(is_nan, ir.Constant(to, 0), result)",
        "return result",
    )
    mp.setitem(function.LOWERINGS, "arith.fptosi_sat", wrong)
    mp.setitem(function.LOWERINGS, "arith.fptoui_sat", wrong)


def plant_bounds_off_by_one(mp: pytest.MonkeyPatch) -> None:
    """A bounds check that traps on an access ending exactly at the memory size."""
    mp.setattr(memory, "checked_address", mutant(memory, "checked_address", '">", end', '">=", end'))


def plant_call_indirect_bounds(mp: pytest.MonkeyPatch) -> None:
    """call_indirect that lets index == table size through (to a null slot of the headroom)."""
    wrong = mutant(control, "lower_call_indirect", '">=", index, size', '">", index, size')
    mp.setitem(function.LOWERINGS, "func.call_indirect", wrong)


def plant_load_crash(mp: pytest.MonkeyPatch) -> None:
    """A lowering that crashes (not a TensorWasmError) on loads: the robustness check."""

    def crash(fl, op, args):
        raise IndexError("planted")

    mp.setitem(function.LOWERINGS, "mem.load", crash)


# Budgets in generated cases (functions, kernels, smith modules), the most a search may
# take: the cases a planted bug needs vary with the seed and with the modules imported (which
# feed Hypothesis's pool of constants), up to 1700 in a sample of seeds (past 2000 for the
# control family's bounds, with some sets of test files collected together).
TEETH = [
    ("numeric", plant_shift_mask, r"i(32|64)\.sh[lr]", 2000),
    ("numeric", plant_min_max_nan, r"f(32|64)\.(min|max)", 2000),
    ("numeric", plant_trunc_sat_nan, r"trunc_sat", 2000),
    ("control", plant_bounds_off_by_one, r"load|store|memory\.(fill|copy)", 6000),
    ("control", plant_call_indirect_bounds, r"call_indirect", 2000),
    ("loops", plant_bounds_off_by_one, r"load|store", 2000),
    ("smith", plant_load_crash, r"\.load", 100),
]


@pytest.mark.parametrize(
    ("generator", "plant", "culprit", "budget"), TEETH, ids=[f"{g}-{p.__name__[6:]}" for g, p, _, _ in TEETH]
)
def test_planted_miscompile_is_found_and_shrunk(
    generator: str, plant, culprit: str, budget: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A planted bug changes the compiler without changing its source: compile everything.
    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    with monkeypatch.context() as mp:
        plant(mp)
        report = fuzz_generator(
            generator, max_examples=budget, seed=20240, shrink_seconds=SHRINK_SECONDS, save_dir=tmp_path
        )
        assert report.failures, f"{generator} did not find {plant.__name__} in {budget} cases"
        failure = report.failures[0]
        shrunk = failure.case
        assert failure.first is not None
        assert re.search(culprit, shrunk.text()), shrunk.text()
        # Shrinking isolates the failing program: a module of one generated case.
        assert shrunk.programs == 1, shrunk.text()
        assert {call.program for call in shrunk.calls} <= {0}
        assert failure.saved is not None and failure.saved.with_suffix(".json").exists()
        replayed = Case.load(failure.saved)
        assert run_case(replayed).failed  # the saved files reproduce the failure...
    assert not run_case(replayed).failed  # ...which is the planted bug's, and only its


def _planted_replay_is_found(
    mp: pytest.MonkeyPatch, owner, name: str, old: str, new: str, tmp_path: Path
) -> None:
    """With ``owner.name`` planted (:func:`mutant`), the loops family on the simulated device
    finds a failure, shrunk to one program whose last call is the one before made again, and
    saved so that it fails with the plant and passes without it. (Every arrival the guards
    allow launches here: the backend's drawn declines, a draw per module, would change with
    each program the shrinker drops.)"""
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance

    def launching(wasm: bytes):
        return SimulatedOffloadInstance(wasm, filters=True)

    with mp.context() as planted:
        planted.setattr(owner, name, mutant(owner, name, old, new))
        report = fuzz_generator(
            "loops", launching, max_examples=2000, seed=20240, shrink_seconds=SHRINK_SECONDS,
            save_dir=tmp_path,
        )  # fmt: skip
        assert report.failures, f"the loops family did not find the planted {owner.__name__}.{name}"
        shrunk = report.failures[0].case
        assert shrunk.programs == 1, shrunk.text()
        assert shrunk.calls[-1] == shrunk.calls[-2]  # found by a call made again
        replayed = Case.load(report.failures[0].saved)
        assert run_case(replayed, launching).failed
    assert not run_case(replayed, launching).failed


def test_a_replay_that_skips_its_launch_is_found_on_the_simulated_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runtime's teeth too: an arrival replayed as an earlier one (the same live-ins)
    that skips the launch and takes the results staged last time leaves memory as that
    launch did, which the loops family's repeated calls on changed memory catch."""
    from tensorwasm.runtime.device_replay import DeviceReplays

    _planted_replay_is_found(monkeypatch, DeviceReplays, "replay", "again.launch(again.stream)", "again.stream",
                             tmp_path)  # fmt: skip


def test_a_native_replay_that_moves_no_results_is_found_on_the_simulated_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same teeth for replays in native code (:mod:`runtime.replay`): one that launches
    but leaves its staged results out of linear memory is caught by the calls made again."""
    from tensorwasm.runtime.device_replay import NativeReplay

    _planted_replay_is_found(
        monkeypatch, NativeReplay, "arm_with", "arm.n_staged, arm.staged = len(again.staged),",
        "arm.n_staged, arm.staged = 0,", tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_unmodified_compiler_passes(generator: str, tmp_path: Path) -> None:
    examples = {"numeric": 600, "control": 400, "loops": 250, "smith": 100}[generator]  # cases
    report = fuzz_generator(generator, max_examples=examples, seed=7, shrink_seconds=5.0, save_dir=tmp_path)
    assert not report.failures, report.failures[0].summary()
    assert examples <= report.generated < examples + BATCH
    assert report.modules < report.generated or generator == "smith"  # cases are batched
    assert report.calls >= examples / 2  # cases are not mostly skipped or call-less
    assert report.calls_skipped <= report.calls / 20


def test_a_time_limit_ends_the_run_without_changing_what_the_seed_generates() -> None:
    """A fuzzing run with a time limit is the prefix of a longer one with the same seed."""
    fuzz_generator("numeric", seconds=0.3, seed=5)  # imports: they feed Hypothesis's constants
    runs: list[list[str]] = [[], []]
    for seconds, seen in zip((1.0, 2.5), runs, strict=True):

        def factory(wasm: bytes, seen: list[str] = seen) -> HostExecutor:
            seen.append(hashlib.sha256(wasm).hexdigest())
            return HostExecutor(wasm)

        report = fuzz_generator("numeric", factory, seconds=seconds, seed=5)
        assert report.seconds < seconds + 1.0, "the run did not stop at its time limit"
    short, long = runs
    assert short and len(long) > len(short)
    assert long[: len(short)] == short


def test_parallel_jobs_add_up(tmp_path: Path) -> None:
    report, _ = fuzz(["numeric", "loops"], max_examples=30, seed=3, save_dir=tmp_path, stream=None, jobs=2)
    assert not report.failures
    for name in ("numeric", "loops"):
        stats = report.by_generator[name]
        assert stats.generated >= 30 and stats.modules < stats.generated  # 15 cases a process at least
    assert report.cases == sum(stats.cases for stats in report.by_generator.values())


def test_a_case_crosses_processes_without_its_subset() -> None:
    """Parallel jobs send their failures to the parent: a case pickles, less the closure
    that rebuilds it from some of its programs."""
    from tensorwasm.oracle.generators import _numeric_module

    funcs = [(f'  (func (export "f{k}") (result i32) i32.const {k})', [Call(f"f{k}", ())]) for k in range(3)]
    case = _numeric_module(funcs)
    assert case.programs == 3 and [c.program for c in case.calls] == [0, 1, 2]
    alone = case.subset([2])
    assert alone.programs == 1 and alone.calls == [Call("f2", (), program=0)] and "f0" not in alone.text()
    copy = pickle.loads(pickle.dumps(case))
    assert copy.subset is None and copy.text() == case.text() and copy.calls == case.calls
    assert not run_case(copy).failed


def test_numeric_generator_covers_every_numeric_op() -> None:
    from tensorwasm.oracle.generators import OPS_BY_RESULT

    covered = {op.name for ops in OPS_BY_RESULT.values() for op in ops}
    assert covered == {op.name for op in numeric_ops()}
    assert len(covered) > 120


def test_const_text_keeps_every_bit() -> None:
    import wasmtime

    from tensorwasm.runtime.reference import ReferenceInstance

    for ty, bits in [(F32, 0x7FA00001), (F32, 0xFFC00000), (F32, 0x80000001), (F32, 0x7F7FFFFF)]:
        wasm = wasmtime.wat2wasm(f'(module (func (export "k") (result f32) {const_text("f32", bits)}))')
        assert ReferenceInstance(bytes(wasm)).call("k", []).values == ((ty, bits),)


def test_nan_payload_compared_by_class_only_where_open() -> None:
    assert same_value((F32, 0x7FC00001), (F32, 0xFFC00000), exact=False)
    assert not same_value((F32, 0x7FC00001), (F32, 0xFFC00000), exact=True)
    assert not same_value((F32, 0x7FC00000), (F32, 0x7F800000), exact=False)
    assert not same_value((I32, 1), (F32, 1), exact=False)


def test_skips_are_not_mismatches() -> None:
    wat = (
        '(module (import "env" "f" (func $f)) (func (export "uses") call $f)'
        ' (func (export "ok") (result i32) i32.const 1))'
    )
    outcome = run_case(Case("test", wat, [Call("ok", ()), Call("uses", ()), Call("ok", ())]))
    assert not outcome.failed and outcome.passed == 1 and outcome.skipped == 2


@pytest.mark.parametrize("device", ["cpu", "simulated"])
def test_offloaded_loops_match_wasmtime_and_really_offload(device: str) -> None:
    """The loops family through the offload runtime: on the host backend, and on the
    simulated device (the GPU path's copies), where kernels repeated over time steps form
    device-resident regions whose results stay on the "device" between launches. Every
    generated kernel that the detector accepts runs as a kernel and must leave wasmtime's
    results, memory and globals."""
    from hypothesis import HealthCheck, example, given, settings

    from tensorwasm.oracle.compare import run_case
    from tensorwasm.oracle.generators import GENERATORS
    from tensorwasm.oracle.offload import OffloadInstance
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance
    from tests.runtime.test_regions import TIME_LOOP

    # A time loop around a sweep, called twice alike: a region whatever the draws (which
    # Hypothesis varies with the test's timing, derandomized or not).
    run = Call("run", ((I32, 64), (I32, 6), (I32, 0)))
    region = Case("loops", TIME_LOOP.replace("BODY", "").replace("EXIT", ""), [run, run])

    instances: list[OffloadInstance] = []

    def factory(wasm: bytes) -> OffloadInstance:
        instance = OffloadInstance(wasm, "cpu") if device == "cpu" else SimulatedOffloadInstance(wasm)
        instances.append(instance)
        return instance

    # Derandomized: the same cases every run, so that the counts asserted below (regions
    # formed, results kept on the device) do not depend on the luck of one run's draw.
    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(GENERATORS["loops"]())
    @example(region)
    def check(case) -> None:
        outcome = run_case(case, factory)
        assert not outcome.failed, outcome.mismatch

    check()
    assert sum(i.offloaded for i in instances) > 0, "no generated loop was offloaded"
    if device == "simulated":
        regions = [r for i in instances for r in i.offload.region_stats]
        assert sum(r.exits for r in regions) > 0, "no generated region ran"
        assert sum(r.bytes_out for r in regions) > 0, "no region kept results on the device"
        loops = [lp for i in instances for lp in i.offload.loops]
        assert sum(lp.stats.replayed for lp in loops) > 0, "no arrival replayed the last one's launch"
        assert sum(lp.stats.native for lp in loops) > 0, "no arrival replayed in native code"


def test_the_command_line_names_every_generator() -> None:
    from tensorwasm.oracle import GENERATOR_NAMES

    assert tuple(GENERATORS) == GENERATOR_NAMES


def test_fuzz_progress_is_whole_lines_in_a_log_and_one_line_on_a_terminal(monkeypatch) -> None:
    import io
    from types import SimpleNamespace

    import tensorwasm.oracle.fuzz as fuzz

    report = SimpleNamespace(cases=7, failures=[], calls=9, cases_skipped=0)
    monkeypatch.setattr(fuzz, "PROGRESS_LOG_SECONDS", -1.0)
    log = io.StringIO()
    progress = fuzz._progress_line(log)
    progress(report, "loops")
    progress(report, "smith")
    assert log.getvalue().splitlines() == [
        "[loops] 7 cases passed, 0 failed, 9 calls compared, 0 cases skipped",
        "[smith] 7 cases passed, 0 failed, 9 calls compared, 0 cases skipped",
    ]
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    fuzz._progress_line(terminal)(report, "loops")
    assert terminal.getvalue().startswith("\r[loops]") and "\n" not in terminal.getvalue()


def test_drawn_declines_run_a_regions_loops_on_wasmtime_between_its_launches() -> None:
    """The fuzzer's offload instances on the GPU path decline a share of the arrivals whose
    guards passed (drawn per module), so that wasmtime runs loops of a device-resident region
    while the device holds the region's results: memory must still end as wasmtime's, and
    only what those loops touch may come back before the region's end."""
    from tensorwasm.oracle.offload import DRAWN, OffloadInstance
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tests.runtime.test_regions import TIME_LOOP, TOUCH_UP

    wasm = TIME_LOOP.replace("BODY", TOUCH_UP).replace("EXIT", "")
    run = Call("run", ((I32, 500), (I32, 16), (I32, 0)))
    instances = []

    def factory(binary: bytes) -> OffloadInstance:
        instance = OffloadInstance(binary, device=SimulatedDevice(), declines=True)
        for lp in instance.offload.loops:
            lp.estimate.share = 0.5  # (whatever the module's draw: half of them)
        instances.append(instance)
        return instance

    outcome = run_case(Case("loops", wasm, [run, run]), factory)
    assert not outcome.failed, outcome.mismatch
    (instance,) = instances
    loops = instance.offload.loops
    assert all(lp.region == 0 for lp in loops)
    assert sum(lp.stats.declined.get(DRAWN, 0) for lp in loops) > 0
    assert sum(lp.stats.offloaded for lp in loops) > 0
