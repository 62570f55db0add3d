"""Why a loop whose top runs memory operations before its exit test is rejected where the
test reads a load (the counter kept in memory, as unoptimised code keeps it), and accepted
where the test sits halfway through the body (clang's loop unrolled by two for an odd
count)."""

from __future__ import annotations

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tests.conftest import wat

# The counter lives at address 0: loaded, tested, stored back (clang -O0's shape).
COUNTER_IN_MEMORY = """(module (memory 1)
  (func (export "run") (param $n i32)
    (loop $l
      (br_if 1 (i32.ge_s (i32.load (i32.const 0)) (local.get $n)))
      (f32.store offset=64 (i32.shl (i32.load (i32.const 0)) (i32.const 2)) (f32.const 1))
      (i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (i32.const 1)))
      (br $l))))"""

# a[j] += b[j] for two elements a step, the test between them (clang -O2's shape for an odd count).
MID_BODY_EXIT = """(module (memory 1)
  (func (export "run") (param $end i32) (local $j i32)
    (block $done
      (loop $l
        (f32.store offset=4096 (local.get $j)
          (f32.add (f32.load offset=4096 (local.get $j)) (f32.load offset=8192 (local.get $j))))
        (br_if $done (i32.eq (local.get $j) (local.get $end)))
        (f32.store offset=4100 (local.get $j)
          (f32.add (f32.load offset=4100 (local.get $j)) (f32.load offset=8196 (local.get $j))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $l)))))"""


def _reason(text: str) -> str:
    (report,) = analyze_module(translate_module(load(wat(text))))
    assert report.verdict == "reject"
    return report.reason


def test_a_counter_in_memory_is_named_so() -> None:
    assert _reason(COUNTER_IN_MEMORY).endswith(
        "before its exit test (its counter lives in memory, as in unoptimised code)"
    )


def test_an_exit_test_halfway_through_the_body_is_counted_as_its_header_runs() -> None:
    """(Rejected before the loop shape was modelled; tests/compiler/test_mid_exit.py runs it.)"""
    (report,) = analyze_module(translate_module(load(wat(MID_BODY_EXIT))))
    assert report.verdict == "offload", report.reason
    assert not report.trip.top and report.trip.describe() == "(local0) / 8 + 1"
