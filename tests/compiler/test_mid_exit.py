"""Loops whose exit test sits in the middle of the body: clang -O2 unrolls a loop of an odd
constant count by two and tests between the halves (PolyBench's fdtd-2d, its ``ex`` sweep:
``loop { body(j); if (j == last) break; body(j + 1); j += 2 }``). The header runs as a loop
tested at its bottom counts, the half after the test one iteration fewer: the dependence
model gives that half a domain of its own, and the kernels, offloaded, run exactly the
halves wasmtime runs, on the host backend, the simulated device and the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.trips import exits_mid_body, in_tail
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.conftest import wat

# tests/compiler/data/midexit.c, built as its header says.
MIDEXIT = (Path(__file__).parent / "data" / "midexit.wasm").read_bytes()
NX, NY, NY_EVEN = 40, 64, 65  # as midexit.c defines them
EX, HZ = 0x10000, 0x40000  # two arrays of NX x NY_EVEN doubles, apart

DEVICES = ["cpu", "sim", pytest.param("gpu", marks=pytest.mark.gpu)]


def i32s(*values: int) -> list:
    return [(I32, v) for v in values]


def run_both(data: bytes, calls: list[tuple[str, list]], device: str) -> OffloadInstance:
    """Run ``calls`` on wasmtime and offloaded on ``device`` ("sim": the simulated device):
    same results, same memory."""
    reference = ReferenceInstance(data)
    offload = OffloadInstance(data, device=SimulatedDevice() if device == "sim" else device)
    for export, args in calls:
        assert offload.call(export, args) == reference.call(export, args), export
    assert offload.memory() == reference.memory("memory")
    return offload


def launches(instance: OffloadInstance, func: str) -> int:
    return sum(lp.stats.offloaded for lp in instance.offload.loops if lp.plan.func.name == func)


def reports(data: bytes, func: str) -> list:
    return [r for r in analyze_module(translate_module(load(data))) if r.func.name == func]


def mid_exit_loops(data: bytes, func: str) -> list:
    module = translate_module(load(data))
    function = next(f for f in module.functions if f.name == func)
    facts = FunctionLoops(module, function)
    return [info for info in function.loops if exits_mid_body(facts, info)]


# -- clang's loops ------------------------------------------------------------------------


def test_clang_s_odd_count_sweeps_are_counted_and_offloaded_as_2d_grids() -> None:
    """Each of the three repeated nests of ``sweep``: the inner loop (its test halfway)
    counts 32 header runs for 63 columns, and the rows and columns form a 2-D grid."""
    assert len(mid_exit_loops(MIDEXIT, "sweep")) == 3
    found = reports(MIDEXIT, "sweep")
    assert len(found) == 6 and all(r.verdict == "offload" for r in found), [r.reason for r in found]
    for outer in (r for r in found if r.loop.depth == 1):
        assert "2-D grid" in outer.reason
        ((_, inner),) = outer.plan.inner_trips
        assert not inner.top and inner.describe() == "(496) / 16 + 1"  # 32 runs of the header
    (row,) = reports(MIDEXIT, "sweep_row")
    assert row.verdict == "offload" and row.plan.trip.describe() == "(496) / 16 + 1"
    assert mid_exit_loops(MIDEXIT, "sweep_even") == []  # an even count: tested at the bottom


def test_only_the_blocks_after_the_test_are_the_tail() -> None:
    module = translate_module(load(MIDEXIT))
    function = next(f for f in module.functions if f.name == "sweep_row")
    facts = FunctionLoops(module, function)
    (loop,) = function.loops
    assert exits_mid_body(facts, loop)
    assert not in_tail(facts, loop, loop.header)
    tail = [b for b in facts.bodies[loop] if in_tail(facts, loop, b)]
    assert tail and all(b is not loop.header for b in tail)
    assert any(op.name == "mem.store" for b in tail for op in b.ops)  # the second half's store


def _fill() -> list:
    return [("fill", i32s(NX * NY_EVEN, EX, 37)), ("fill", i32s(NX * NY_EVEN, HZ, 11))]


@pytest.mark.parametrize("device", DEVICES)
def test_fdtd_s_ex_sweep_runs_offloaded_as_wasmtime_runs_it(device: str) -> None:
    offload = run_both(MIDEXIT, [*_fill(), ("sweep", i32s(EX, HZ))], device)
    assert launches(offload, "sweep") == 3  # one launch per repeated nest


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_launched_alone_runs_both_halves_of_every_iteration_but_the_last(device: str) -> None:
    offload = run_both(MIDEXIT, [*_fill(), ("sweep_row", i32s(EX + 8 * NY, HZ + 8 * NY))], device)
    assert launches(offload, "sweep_row") == 1


@pytest.mark.parametrize("device", DEVICES)
def test_the_even_count_s_sweep_still_runs_offloaded(device: str) -> None:
    offload = run_both(MIDEXIT, [*_fill(), ("sweep_even", i32s(EX, HZ))], device)
    assert launches(offload, "sweep_even") == 3


def test_the_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module = translate_module(load(MIDEXIT))
    plans = [r.plan for r in analyze_module(module) if r.verdict == "offload" and r.loop.depth == 1
             and r.func.name in ("sweep", "sweep_row")]  # fmt: skip
    assert len(plans) == 4
    assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)


# -- the shape with a bound known at run time ------------------------------------------------

# a[j] += 1 and a[j + 1] += 2 for j = 0, 2, 4, ...: the test `j + 1 < n` between the halves,
# behind `n > 0`. The loop runs its first half where the test lets the second go: for an
# even n the last first half writes a[n], one past the n the test read (wasmtime does too).
RUNTIME_BOUND = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (local $j i32)
    (if (i32.gt_s (local.get $n) (i32.const 0)) (then
      (block $done
        (loop $l
          (i32.store offset=4096 (local.get $j)
            (i32.add (i32.load offset=4096 (local.get $j)) (i32.const 1)))
          (br_if $done (i32.ge_s (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
          (i32.store offset=4100 (local.get $j)
            (i32.add (i32.load offset=4100 (local.get $j)) (i32.const 2)))
          (local.set $j (i32.add (local.get $j) (i32.const 8)))
          (br $l)))))))"""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("elements", [0, 1, 2, 3, 4, 7, 10])
def test_odd_even_one_and_zero_trip_counts_run_as_on_wasmtime(device: str, elements: int) -> None:
    """``n`` of 0 skips the loop; 1 runs the first half once and never the second; odd and
    even counts end on either half. Called twice, so every element shows how often it ran."""
    n = 4 * elements
    offload = run_both(wat(RUNTIME_BOUND), [("run", i32s(n)), ("run", i32s(n))], device)
    assert launches(offload, "run") == (2 if elements else 0)
    words = [int.from_bytes(offload.memory()[4096 + 4 * e : 4100 + 4 * e], "little") for e in range(12)]
    assert words == _runtime_bound_model(elements)


def _runtime_bound_model(elements: int) -> list[int]:
    """RUNTIME_BOUND's words after two calls, element by element."""
    words = [0] * 12
    for _ in range(2):
        j = 0
        while elements > 0:
            words[j] += 1
            if j + 1 >= elements:
                break
            words[j + 1] += 2
            j += 2
    return words


# 20 runs of the header (PolyBench's constant sizes): the first half of iteration k loads
# the word 19 iterations on, beyond every word the second half stores in its 19 runs. Exact
# domains prove the pair apart; a second half counted like the first would store that word
# in iteration 19, and the loop would be refused as sequential (isl: they meet on every launch).
APART_ONLY_EXACTLY = """(module (memory (export "memory") 1)
  (func (export "run") (local $j i32)
    (block $done
      (loop $l
        (i32.store offset=8192 (local.get $j) (i32.load offset=4172 (local.get $j)))
        (br_if $done (i32.eq (local.get $j) (i32.const 76)))
        (i32.store offset=4096 (local.get $j) (i32.add (local.get $j) (i32.const 7)))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $l)))))"""


def test_the_half_after_the_test_has_a_domain_one_iteration_short() -> None:
    (report,) = reports(wat(APART_ONLY_EXACTLY), "run")
    assert report.verdict == "offload", report.reason
    plan = report.plan
    late_store = next(i for i, a in enumerate(plan.accesses) if a.store and a.offset == 4096)
    early_load = next(i for i, a in enumerate(plan.accesses) if not a.store and a.offset == 4172)
    assert (late_store, early_load) in plan.static_dependence_free


@pytest.mark.parametrize("device", DEVICES)
def test_a_pair_apart_only_by_the_short_domain_launches(device: str) -> None:
    offload = run_both(wat(APART_ONLY_EXACTLY), [("run", [])], device)
    assert launches(offload, "run") == 1


# -- what stays refused ------------------------------------------------------------------

# An integer sum in the first half: the thread of the last iteration leaves from the
# middle, past its part of the sum (the back edge carries it on every other iteration).
MID_EXIT_SUM = """(module (memory (export "memory") 1)
  (data (i32.const 4096) "\\01\\00\\00\\00\\02\\00\\00\\00\\03\\00\\00\\00\\04\\00\\00\\00\\05\\00\\00\\00\\06")
  (func (export "run") (param $end i32) (result i32) (local $j i32) (local $s i32)
    (block $done
      (loop $l
        (local.set $s (i32.add (local.get $s) (i32.load offset=4096 (local.get $j))))
        (br_if $done (i32.eq (local.get $j) (local.get $end)))
        (i32.store offset=8192 (local.get $j) (local.get $j))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $l)))
    (local.get $s)))"""


def test_a_reduction_across_the_test_is_refused_by_name() -> None:
    (report,) = reports(wat(MID_EXIT_SUM), "run")
    assert report.verdict == "reject"
    assert report.reason == "a reduction in a loop whose exit test is in the middle of its body"


@pytest.mark.parametrize("device", DEVICES)
def test_a_sum_before_the_test_counts_the_last_iteration_s_term(device: str) -> None:
    for end in (0, 8, 16):
        run_both(wat(MID_EXIT_SUM), [("run", i32s(end))], device)


# Rows whose first half loads before the test and whose second half is an inner loop: a
# thread entering the inner loop directly (a 2-D grid) would run it on the last row too.
TAIL_HOLDS_A_LOOP = """(module (memory (export "memory") 1)
  (func (export "run") (param $rows i32) (local $i i32) (local $j i32) (local $x i32)
    (block $done
      (loop $r
        (local.set $x (i32.load offset=4096 (i32.shl (local.get $i) (i32.const 2))))
        (br_if $done (i32.eq (local.get $i) (local.get $rows)))
        (local.set $j (i32.const 0))
        (loop $c
          (i32.store offset=8192
            (i32.shl (i32.add (i32.shl (local.get $i) (i32.const 3)) (local.get $j)) (i32.const 2))
            (i32.add (local.get $x) (local.get $j)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $c (i32.ne (local.get $j) (i32.const 8))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $r)))))"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_loop_after_the_test_is_no_grid_dimension(device: str) -> None:
    outer = next(r for r in reports(wat(TAIL_HOLDS_A_LOOP), "run") if r.loop.depth == 1)
    assert outer.verdict == "offload", outer.reason
    assert outer.plan.collapse == () and "grid" not in outer.reason
    offload = run_both(wat(TAIL_HOLDS_A_LOOP), [("run", i32s(5))], device)
    assert launches(offload, "run") == 1
