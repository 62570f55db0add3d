"""Loop nests as clang -O2 and PolyBench shape them: the detector accepts them, and running
them offloaded (host backend) leaves memory identical to wasmtime's."""

from __future__ import annotations

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

# Fills 64 KiB of memory with small integers derived from their index (both sides run it).
FILL = """
  (func (export "fill") (local $p i32)
    (loop $l
      (i32.store (local.get $p) (i32.rem_u (i32.mul (local.get $p) (i32.const 2654435761)) (i32.const 1000)))
      (local.set $p (i32.add (local.get $p) (i32.const 4)))
      (br_if $l (i32.lt_u (local.get $p) (i32.const 65536)))))
"""


def verdicts(data: bytes) -> dict[tuple[str, int], tuple[str, str]]:
    """(function, loop depth) -> (verdict, reason) of the first loop at that depth."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    for r in analyze_module(translate_module(load(data))):
        out.setdefault((r.func.name, r.loop.depth), (r.verdict, r.reason))
    return out


def run_both(data: bytes, calls: list[tuple[str, list]]) -> OffloadInstance:
    """Run ``calls`` on wasmtime and offloaded on the host backend: same results, same memory."""
    reference = ReferenceInstance(data)
    offload = OffloadInstance(data, device="cpu")
    for export, args in calls:
        assert offload.call(export, args) == reference.call(export, args), export
    assert offload.memory() == reference.memory("memory")
    return offload


def offloaded_at_depth(instance: OffloadInstance, func: str, depth: int) -> int:
    """Launches of the loops of ``func`` at ``depth``."""
    return sum(
        lp.stats.offloaded for lp in instance.offload.loops
        if lp.plan.func.name == func and lp.plan.loop.depth == depth
    )  # fmt: skip


def i32s(*values: int) -> list:
    return [(I32, v) for v in values]


# The outer loop carries $t (assigned in the inner loop), but every inner iteration sets it
# before reading it: dead in the outer loop, so it says nothing about it.
DEAD_CARRIED = f"""(module (memory (export "memory") 1) {FILL}
  (func (export "rowsum") (param $a i32) (param $out i32) (param $n i32)
    (local $i i32) (local $j i32) (local $t i32) (local $s i32)
    (loop $rows
      (local.set $s (i32.const 0))
      (local.set $j (i32.const 0))
      (loop $cols
        (local.set $t (i32.load (i32.add (local.get $a)
          (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))))
        (local.set $s (i32.add (local.get $s) (i32.mul (local.get $t) (local.get $t))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $cols (i32.lt_s (local.get $j) (local.get $n))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (local.get $s))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_s (local.get $i) (local.get $n))))))
"""


def test_a_carried_local_overwritten_before_use_does_not_block_the_outer_loop() -> None:
    data = wat(DEAD_CARRIED)
    assert verdicts(data)[("rowsum", 1)][0] == "offload"
    offload = run_both(data, [("fill", []), ("rowsum", i32s(0, 40000, 60))])
    assert offloaded_at_depth(offload, "rowsum", 1) == 1


# The inner loop walks a pointer from a start no polynomial gives (a bit mask of the row),
# counting with a counter of its own: its loads are gathers, the outer loop stays parallel.
UNKNOWN_INNER_START = f"""(module (memory (export "memory") 1) {FILL}
  (func (export "masked") (param $a i32) (param $out i32) (param $n i32)
    (local $i i32) (local $c i32) (local $p i32) (local $s i32)
    (loop $rows
      (local.set $s (i32.const 0))
      (local.set $c (i32.const 0))
      (local.set $p (i32.add (local.get $a) (i32.shl (i32.and (local.get $i) (i32.const 7)) (i32.const 2))))
      (loop $cols
        (local.set $s (i32.xor (local.get $s) (i32.load (local.get $p))))
        (local.set $p (i32.add (local.get $p) (i32.const 12)))
        (local.set $c (i32.add (local.get $c) (i32.const 1)))
        (br_if $cols (i32.lt_s (local.get $c) (local.get $n))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (local.get $s))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_s (local.get $i) (local.get $n))))))
"""


def test_an_inner_counter_from_an_unknown_start_leaves_the_outer_loop_parallel() -> None:
    data = wat(UNKNOWN_INNER_START)
    assert verdicts(data)[("masked", 1)][0] == "offload"
    offload = run_both(data, [("fill", []), ("masked", i32s(0, 40000, 50))])
    assert offloaded_at_depth(offload, "masked", 1) == 1
