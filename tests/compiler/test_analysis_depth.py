"""The loop analysis of a deep nest of counted loops (clang's shape: a counter per loop,
reset before it starts) does per loop what only depends on that loop once, whichever
candidate around it asks; and the loops' bodies take memory linear in the function."""

from __future__ import annotations

from benchmarks.scaling import module_text
from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis import induction, loops, trips
from tensorwasm.compiler.analysis.forest import FunctionLoops
from tests.conftest import wat


def _function(shape: str, depth: int):
    state = pipeline.run(pipeline.Request(wat(module_text(shape, depth))), "dialect")
    module = state.dialect.module
    (func,) = [f for f in module.functions if not f.is_import and f.loops]
    return module, func


def _count_calls(monkeypatch, owner, name: str) -> list:
    calls = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_each_loops_exit_test_is_read_once_in_a_300_deep_counted_nest(monkeypatch) -> None:
    module, _ = _function("counted", 300)
    made = _count_calls(monkeypatch, trips, "_exit_test")
    asked = _count_calls(monkeypatch, trips, "exit_test")
    reports = loops.analyze_module(module)
    assert len(reports) == 300
    # Every candidate reads the trip count of every loop inside it (45,150 questions, and
    # one more per loop for a rejected loop's report), each answered from one reading.
    assert len(asked) >= 300 * 301 // 2
    assert len(made) == 300
    assert len({id(args[1]) for args in made}) == 300
    # (the verdict itself: the innermost store meets the load of the next iteration)
    assert all(r.verdict == "reject" and "may overlap" in r.reason for r in reports)


def test_the_work_per_inner_loop_does_not_grow_with_the_depth(monkeypatch) -> None:
    """Each candidate asks about each loop inside it (a number of questions quadratic in the
    depth, the plan lists them); each answer must cost the same at any depth: counter
    symbols asked for (once a walk over the loops around each inner loop) grow as the
    questions do, x4 per doubling, never x8."""
    asked = {}
    for depth in (75, 150):
        module, _ = _function("counted", depth)
        calls = _count_calls(monkeypatch, induction.LoopValues, "counter")
        loops.analyze_module(module)
        asked[depth] = len(calls)
        monkeypatch.undo()
    pairs = {d: d * (d + 1) // 2 for d in asked}
    assert asked[150] / asked[75] < 1.1 * pairs[150] / pairs[75]
    assert asked[150] < 6 * pairs[150]


def test_loop_bodies_share_one_list_of_blocks() -> None:
    module, func = _function("nesting", 400)
    facts = FunctionLoops(module, func)
    views = list(facts.bodies.values())
    # One list for the function's loop blocks, each loop a slice of it (sets per loop held
    # 400 * 401 / 2 blocks and more).
    assert len({id(v._order) for v in views}) == 1
    assert len(views[0]._order) <= len(func.blocks)
    assert len(views[0]) == len(views[0]._order) and len(views[-1]) < 10
    # As sets: the outer loop holds the inner ones, and set operations give sets.
    assert set(views[-1]) < set(views[0]) and views[-1] <= views[0]
    assert views[0] - views[-1] == set(views[0]) - set(views[-1])
    assert func.blocks[0] not in views[0]
