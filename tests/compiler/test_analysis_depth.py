"""The loop analysis of a deep nest of counted loops (clang's shape: a counter per loop,
reset before it starts) does per loop what only depends on that loop once, whichever
candidate around it asks; a loop heading a nest deeper than ``MAX_LOOP_DEPTH`` is rejected
without its inner nest analysed in its symbols, so the work grows linearly with the depth;
and the loops' bodies take memory linear in the function."""

from __future__ import annotations

import re

from benchmarks.scaling import module_text
from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis import induction, loops, trips
from tensorwasm.compiler.analysis.forest import MAX_LOOP_DEPTH, FunctionLoops
from tests.conftest import wat


def _function(shape: str, depth: int, text: str | None = None):
    state = pipeline.run(pipeline.Request(wat(text or module_text(shape, depth))), "dialect")
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
    # Every candidate within the limit reads the trip count of every loop inside it, and
    # every loop its own for its report, each answered from one reading.
    limit = MAX_LOOP_DEPTH
    assert len(asked) == 300 + limit * (limit + 1) // 2
    assert len(made) == 300
    assert len({id(args[1]) for args in made}) == 300
    # (the verdict itself: the loops around the innermost 64 head too deep a nest; those
    # the innermost store meets the load of the next iteration)
    deep, within = reports[: 300 - limit], reports[300 - limit :]
    assert [r.reason.split("; ")[-1] for r in deep] == [
        f"nest deeper than {limit} loops ({300 - k} deep)" for k in range(300 - limit)
    ]
    assert all(r.verdict == "reject" and "may overlap" in r.reason for r in within)


def test_the_work_per_inner_loop_does_not_grow_with_the_depth(monkeypatch) -> None:
    """Each candidate asks about each loop inside it (a number of questions quadratic in the
    depth of a nest within the limit, the plan lists them); each answer must cost the same
    at any depth: counter symbols asked for (once a walk over the loops around each inner
    loop) grow as the questions do, x4 per doubling, never x8."""
    asked = {}
    for depth in (MAX_LOOP_DEPTH // 2, MAX_LOOP_DEPTH):
        module, _ = _function("counted", depth)
        calls = _count_calls(monkeypatch, induction.LoopValues, "counter")
        loops.analyze_module(module)
        asked[depth] = len(calls)
        monkeypatch.undo()
    pairs = {d: d * (d + 1) // 2 for d in asked}
    small, large = sorted(asked)
    assert asked[large] / asked[small] < 1.1 * pairs[large] / pairs[small]
    assert asked[large] < 6 * pairs[large]


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


def test_the_analysis_of_a_deep_counted_nest_grows_linearly_with_its_depth(monkeypatch) -> None:
    """Every (candidate, inner loop) pair the analysis works on costs one trip count and one
    classification of the inner loop's header arguments: quadratic in the depth before the
    limit (x4 per doubling: 80,600 pairs at 400), now at most the depth times the limit."""
    work = {}
    for depth in (400, 800):
        module, _ = _function("counted", depth)
        counted = _count_calls(monkeypatch, trips, "trip_count")
        classified = _count_calls(monkeypatch, induction.LoopValues, "classify_header_args")
        reports = loops.analyze_module(module)
        assert len(reports) == depth
        work[depth] = len(counted) + len(classified)
        assert work[depth] <= 2 * depth * (MAX_LOOP_DEPTH + 1)
        monkeypatch.undo()
    assert work[800] - work[400] <= 2 * 400  # each loop more: its own trip count and classification


def _parallel_innermost(depth: int) -> str:
    """``depth`` counted loops nested, the innermost writing ``a[i] = i`` (independent
    iterations: an offload candidate), the one around it adding to a cell of memory after
    it (the loops around the innermost meet that cell's load again in their next iteration)."""
    locals_ = " ".join(f"(local $i{k} i32)" for k in range(depth))
    opens = "".join(
        f"(local.set $i{k} (i32.const 0)) (block $b{k} (loop $l{k}"
        f" (br_if $b{k} (i32.ge_u (local.get $i{k}) (local.get $n)))\n"
        for k in range(depth)
    )
    last = f"$i{depth - 1}"
    body = f"(i32.store (i32.shl (local.get {last}) (i32.const 2)) (local.get {last}))\n"
    tails = ""
    for k in reversed(range(depth)):
        tails += f"(local.set $i{k} (i32.add (local.get $i{k}) (i32.const 1))) (br $l{k})))\n"
        if k == depth - 1:
            tails += "(i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (i32.const 1)))\n"
    return f'(module (memory 1) (func (export "f") (param $n i32) {locals_}\n{opens}{body}{tails}))'


def test_a_loop_heading_too_deep_a_nest_is_rejected_unexamined_and_its_inner_loops_stay(monkeypatch) -> None:
    limit = MAX_LOOP_DEPTH
    verdicts = {}
    for depth in (limit, limit + 3):
        module, _ = _function("counted", depth, _parallel_innermost(depth))
        classified = _count_calls(monkeypatch, induction.LoopValues, "classify_header_args")
        reports = loops.analyze_module(module)
        monkeypatch.undo()
        verdicts[depth] = [(r.verdict, re.sub(r"\+0x[0-9a-f]+", "@", r.reason)) for r in reports]
        # No loop heading more than the limit classified a loop inside it in its symbols.
        too_deep = {r.loop for r in reports[: depth - limit]}
        assert not [
            (values, loop)
            for values, loop in classified
            if values.info in too_deep and loop is not values.info
        ]
        assert reports[-1].verdict == "offload"
    # Within the limit nothing is rejected for its depth; above it the loops around the
    # innermost 64 are, and those 64 keep their verdicts.
    assert not [v for v in verdicts[limit] if "nest deeper" in v[1]]
    assert verdicts[limit + 3][:3] == [
        ("reject", f"nest deeper than {limit} loops ({limit + 3 - k} deep)") for k in range(3)
    ]
    assert verdicts[limit + 3][3:] == verdicts[limit]
