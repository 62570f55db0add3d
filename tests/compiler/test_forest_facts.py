"""The loop forest's facts, made in time linear in the function, equal their definitions."""

from __future__ import annotations

import pytest

from benchmarks.scaling import module_text
from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis import loops
from tensorwasm.compiler.analysis.forest import FunctionLoops, only_traps
from tensorwasm.dialect.verifier import dominators, reverse_postorder
from tests.conftest import CORPUS, wat


def _functions(data: bytes):
    state = pipeline.run(
        pipeline.Request(data, entries=pipeline.LOOPS, translate=pipeline.LOOP_CLOSURE), "dialect"
    )
    module = state.dialect.module
    return [(module, f) for f in module.functions if not f.is_import and f.loops]


def _dominates_by_walk(idom, a, b) -> bool:
    while True:
        if a is b:
            return True
        parent = idom.get(b)
        if parent is None or parent is b:
            return False
        b = parent


def _natural_body(facts: FunctionLoops, idom, info) -> set:
    header = info.header
    body, work = {header}, [p for p in facts.preds[header] if _dominates_by_walk(idom, header, p)]
    while work:
        b = work.pop()
        if b not in body:
            body.add(b)
            work.extend(facts.preds[b])
    return body


SHAPES = [
    wat(module_text("nesting", 12)),
    wat(module_text("functions", 3)),
    wat(
        '(module (memory 1) (func (export "f") (param $n i32) (local $i i32) (local $j i32)'
        " (block $out (loop $a (br_if $out (i32.ge_s (local.get $i) (local.get $n)))"
        "  (local.set $j (i32.const 0))"
        "  (block $b (loop $c (br_if $b (i32.ge_s (local.get $j) (local.get $n)))"
        "   (br_if $out (i32.eq (local.get $j) (i32.const 7)))"  # an exit of both loops at once
        "   (local.set $j (i32.add (local.get $j) (i32.const 1))) (br $c)))"
        "  (block $d (loop $e (br_if $d (local.get $j)) (local.set $j (i32.const 1)) (br $e)))"
        "  (local.set $i (i32.add (local.get $i) (i32.const 1))) (br $a)))))"
    ),
]


@pytest.mark.parametrize("data", SHAPES + [p.read_bytes() for p in CORPUS[:12]])
def test_bodies_exits_and_dominance_match_their_definitions(data: bytes) -> None:
    for module, func in _functions(data):
        facts = FunctionLoops(module, func)
        order = reverse_postorder(func)
        idom = dominators(order)
        for a in func.blocks[:40]:
            for b in func.blocks[:40]:
                assert facts.dominates(a, b) == _dominates_by_walk(idom, a, b)
        for info in func.loops:
            body = _natural_body(facts, idom, info)
            assert facts.bodies[info] == body
            exits = sorted(
                (func.blocks.index(b), k)
                for b in body
                for k, s in enumerate(b.terminator.successors)
                if s.block not in body and not only_traps(s.block)
            )
            found = [(func.blocks.index(b), term) for b, term in facts.exits(info)]
            assert sorted(p for p, _ in found) == [p for p, _ in exits]
            assert all(term is func.blocks[p].terminator for p, term in found)
            inner = [m for m in func.loops if m.header in body]
            assert facts.nested(info) == inner
            assert facts.in_order(body) == [b for b in func.blocks if b in body]


def test_each_block_is_read_once_for_effects_however_deep_the_nest(monkeypatch) -> None:
    reads = []
    real = loops._block_effect
    monkeypatch.setattr(
        loops, "_block_effect", lambda module, block: reads.append(block) or real(module, block)
    )
    ((module, func),) = _functions(wat(module_text("nesting", 60)))
    reports = loops.analyze_module(module)
    assert len(reports) == 60 and reports[-1].verdict == "offload"
    in_loops = set().union(*FunctionLoops(module, func).bodies.values())
    assert len(reads) == len(set(reads)) and set(reads) == in_loops  # each once, not once a loop around it
