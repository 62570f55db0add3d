"""The translator: structured control to a CFG with block arguments, checked as text."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.printer import print_function
from tests.conftest import CORPUS, wat


def translate(text: str, name: str = "f") -> str:
    module = translate_module(load(wat(f"(module {text})")))
    return print_function(module.function(name))


def test_locals_become_ssa_values() -> None:
    text = translate(
        '(func (export "f") (param i32) (result i32) (local i32)'
        " local.get 0 i32.const 1 i32.add local.set 1 local.get 1 local.get 1 i32.mul)"
    )
    assert text == (
        "func @f(i32) -> (i32) exports 'f' {\n"
        "^bb0(%0: i32):\n"
        "  %1 = arith.constant 1 : i32\n"
        "  %2 = arith.add %0, %1 : i32\n"
        "  %3 = arith.mul %2, %2 : i32\n"
        "  cf.return %3\n"
        "}\n"
    )


def test_if_else_merges_locals_through_block_arguments() -> None:
    text = translate(
        '(func (export "f") (param i32) (result i32) (local i32)'
        " local.get 0 if i32.const 10 local.set 1 else i32.const 20 local.set 1 end local.get 1)"
    )
    assert "cf.cond_br %2 ^bb1, ^bb2" in text
    assert "^bb3(%5: i32):" in text  # one argument: the local both arms set
    assert "cf.return %5" in text
    assert "arith.cmpi ne, %0" in text  # the i32 condition tested against zero


def test_comparison_feeds_branch_as_i1_without_widening() -> None:
    text = translate(
        '(func (export "f") (param i32 i32) (result i32)'
        " local.get 0 local.get 1 i32.lt_s if (result i32) i32.const 1 else i32.const 2 end)"
    )
    assert "arith.cmpi slt, %0, %1 : i1" in text
    assert "arith.zext" not in text  # the widened value had no other use


def test_loop_header_takes_only_assigned_locals_and_is_marked() -> None:
    text = translate(
        '(func (export "f") (param $n i32) (param $k i32) (result i32) (local $i i32) (local $s i32)'
        " (loop $l"
        "   local.get $s local.get $k i32.add local.set $s"
        "   local.get $i i32.const 1 i32.add local.tee $i"
        "   local.get $n i32.lt_u br_if $l)"
        " local.get $s)"
    )
    lines = text.splitlines()
    header = next(line for line in lines if "loop header" in line)
    assert header.startswith("^bb1(%3: i32, %4: i32):")  # $i and $s, not $n or $k
    assert "depth 1" in header
    assert "cf.cond_br %8 ^bb1(%7, %5), ^bb2" in text


def test_nested_loops_record_depth_and_parent() -> None:
    module = translate_module(
        load(
            wat(
                '(module (func (export "f") (param i32) (local i32 i32)'
                " (loop $outer (loop $inner local.get 1 i32.const 1 i32.add local.tee 1"
                " local.get 0 i32.lt_u br_if $inner)"
                " local.get 2 i32.const 1 i32.add local.tee 2 local.get 0 i32.lt_u br_if $outer)))"
            )
        )
    )
    func = module.function("f")
    outer, inner = func.loops
    assert (outer.depth, inner.depth) == (1, 2)
    assert inner.parent is outer and outer.parent is None
    assert outer.header.attrs["loop"] is outer
    assert outer.offset < inner.offset


def test_br_table_becomes_switch_with_default_last() -> None:
    text = translate(
        '(func (export "f") (param i32) (result i32)'
        " (block (block (block local.get 0 br_table 0 1 2) i32.const 10 return)"
        " i32.const 20 return) i32.const 30)"
    )
    assert "cf.switch %0 [^bb1, ^bb2], default ^bb3" in text


def test_multi_value_block_results_and_params() -> None:
    text = translate(
        "(type $p (func (param i32) (result i32 i32)))"
        '(func (export "f") (param i32) (result i32 i32)'
        " local.get 0 (block (type $p) i32.const 1 i32.add local.get 0 local.get 0 br_if 0"
        " i32.const 7 i32.add))"
    )
    assert "func @f(i32) -> (i32, i32)" in text
    # Only the second result differs between the branch and the fall-through.
    assert "^bb2(%7: i32):" in text
    assert "cf.return %2, %7" in text


def test_dead_code_after_branch_is_skipped() -> None:
    text = translate(
        '(func (export "f") (result i32) i32.const 1 return'
        " (block (loop i32.const 5 drop br 0)) i32.const 2 i32.add)"
    )
    assert "loop header" not in text and "arith.add" not in text
    assert text.count("cf.return") == 1


def test_unreachable_becomes_trap() -> None:
    assert "cf.trap {kind = unreachable}" in translate('(func (export "f") unreachable)')


def test_calls_carry_their_signatures() -> None:
    text = translate(
        "(type $t (func (param i32) (result i64)))"
        '(import "env" "g" (func $g (type $t)))'
        "(table 1 funcref)"
        '(func (export "f") (param i32) (result i64)'
        " local.get 0 call $g local.get 0 local.get 0 call_indirect (type $t) i64.add)"
    )
    assert "func.call %0 {callee = 0, sig = (i32) -> (i64)} : i64" in text
    assert "func.call_indirect %0, %0 {table = 0, type = 0, sig = (i32) -> (i64)} : i64" in text


def test_memory_ops_keep_their_memarg() -> None:
    text = translate(
        '(memory 1) (func (export "f") (param i32) (result i64)'
        " local.get 0 local.get 0 i32.load16_s offset=6 align=1 i32.store8 offset=3"
        " local.get 0 i64.load32_u offset=100)"
    )
    assert "mem.load %0 {type = i32, bits = 16, signed = true, offset = 6, align = 0} : i32" not in text
    assert "mem.load %0 {bits = 16, signed = true, offset = 6, align = 0} : i32" in text
    assert "mem.store %0, %1 {bits = 8, offset = 3, align = 0} : i32" in text
    assert "mem.load %0 {bits = 32, signed = false, offset = 100, align = 2} : i64" in text


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(Path(*p.parts[-3:])))
def test_corpus_module_translates_and_verifies(path: Path) -> None:
    wasm = load(path.read_bytes())
    module = translate_module(wasm)
    defined = [f for f in module.functions if not f.is_import]
    assert len(defined) == len(wasm.codes)
    loops_in_wasm = sum(1 for code in wasm.codes for i in code.body if i.op.name == "loop")
    assert sum(len(f.loops) for f in defined) <= loops_in_wasm
    if "loops" in path.parts and ".O0." not in path.name:
        assert any(f.loops for f in defined), "optimised loop kernels must contain loops"


def test_each_loop_gets_the_locals_set_anywhere_inside_it_and_only_those() -> None:
    from tensorwasm.compiler.frontend.translate import loop_assignments

    data = wat("""(module (func (param i32) (local i32 i32 i32)
      (local.set 1 (i32.const 0))
      (loop $a
        (local.set 2 (i32.const 1))
        (loop $b (local.set 3 (local.tee 1 (i32.const 2))) (br_if $b (local.get 0)))
        (loop $c (br_if $c (local.get 0)))
        (br_if $a (local.get 0)))
      (loop $d (local.set 2 (i32.const 3)) (br_if $d (local.get 0)))
      (drop (i32.add (local.get 1) (i32.add (local.get 2) (local.get 3))))))""")
    body = load(data).codes[0].body
    starts = [i for i, x in enumerate(body) if x.op.name == "loop"]
    found = loop_assignments(body)
    assert [found[i] for i in starts] == [[1, 2, 3], [1, 3], [], [2]]
    for i in starts:  # the same as scanning each loop's whole body
        inside = body[i + 1 : body[i].match]
        assert found[i] == sorted({x.imm for x in inside if x.op.name in ("local.set", "local.tee")})
