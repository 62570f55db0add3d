"""Decoding for ``tensorwasm run``: what the compiler cannot translate is marked, per function
or for the whole module, never refused; ``load`` validates before it decodes any body."""

from __future__ import annotations

import tracemalloc

import pytest

from tensorwasm.compiler.degrade import stays_on_wasmtime
from tensorwasm.compiler.errors import DecodeError, UnsupportedFeature, ValidationError
from tensorwasm.compiler.frontend import load
from tensorwasm.compiler.frontend.decoder import decode
from tensorwasm.compiler.rewrite import FUNC_INDEX_OPS, rewrite
from tests.conftest import wat
from tests.wasmbin import FUNC_SECTION, HEADER, TYPE_SECTION, body, section, vec

# One function per proposal, each with a loop, and a plain one that calls across them.
MIXED = """(module
  (memory 1) (memory $two 1)
  (tag $e (param i32))
  (export "e" (tag $e))
  (func $atomic (param $n i32) (result i32)
    (loop $l
      (drop (i32.atomic.rmw.add (i32.const 0) (i32.const 1)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (atomic.fence)
    (i32.atomic.load (i32.const 0)))
  (func $tail (param i32) (result i32) (return_call $plain (local.get 0)))
  (func $catch (param i32) (result i32)
    (block $h (result i32)
      (try_table (catch $e $h) (throw $e (local.get 0)))
      (i32.const -1)))
  (func $second (result i32) (i32.load $two (i32.const 0)))
  (func $plain (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
  (func $caller (param $n i32) (result i32)
    (loop $l
      (drop (call $tail (local.get $n)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
)"""


def test_each_unsupported_body_marks_its_function_with_proposal_and_offset() -> None:
    wasm = load(wat(MIXED), degrade=True)
    assert wasm.blocked is None and wasm.offload_blocker() is None
    found = wasm.untranslatable()
    assert sorted(found) == [0, 1, 2, 3]
    assert [found[i].proposal for i in range(4)] == [
        "threads",
        "tail calls",
        "exception handling",
        "multi-memory",
    ]
    for index, exc in found.items():
        assert exc.func_index == index
        assert wasm.raw[exc.offset] == {0: 0xFE, 1: 0x12, 2: 0x1F, 3: 0x28}[index], exc
    # The bodies were read on: every instruction is there, to be copied and renumbered.
    assert [i.op.name for i in wasm.codes[1].body] == ["local.get", "return_call", "end"]
    assert wasm.codes[1].body[1].imm == 4
    catch = wasm.codes[2].body
    assert catch[1].op.name == "try_table" and catch[1].imm == (None, ((0, 0, 0),))
    assert catch[0].match == len(catch) - 2 and catch[1].match == 4  # try_table's end is matched
    assert "uses the threads proposal (instruction 0xfe 30 at offset 0x" in stays_on_wasmtime(wasm)[0]


def test_a_loop_that_calls_into_an_unsupported_function_keeps_its_function_on_wasmtime() -> None:
    stays = stays_on_wasmtime(load(wat(MIXED), degrade=True))
    assert set(stays) == {0, 1, 2, 3, 5}  # $plain has no loop and calls nothing unsupported
    assert "calls tail, which uses" in stays[5] and "tail calls proposal" in stays[5], stays[5]


def test_without_degrade_the_same_module_is_refused_at_the_first_use() -> None:
    with pytest.raises(UnsupportedFeature) as info:
        load(wat(MIXED))
    tags = next(start for sid, start, _ in decode(wat(MIXED), degrade=True).sections if sid == 13)
    assert "tag section" in str(info.value) and info.value.offset == tags - 2  # first in the bytes
    with pytest.raises(UnsupportedFeature, match="threads") as info:
        load(wat(MIXED.replace("(tag $e (param i32))", "").replace('(export "e" (tag $e))', "")
                 .replace("(catch $e $h) (throw $e (local.get 0))", "")))  # fmt: skip
    assert info.value.func_index == 0


@pytest.mark.parametrize(
    ("text", "proposal"),
    [
        ("(module (memory i64 1))", "memory64"),
        ("(module (memory 1 1 shared))", "threads"),
        ("(module (type (struct (field i32))))", "GC"),
        ("(module (global (mut exnref) (ref.null exn)))", "exception handling"),
    ],
)
def test_module_level_uses_block_the_whole_module(text: str, proposal: str) -> None:
    wasm = load(wat(text), degrade=True)
    assert wasm.blocked is not None and proposal in str(wasm.blocked)
    assert wasm.offload_blocker() is wasm.blocked


def test_a_body_whose_encoding_is_unknown_blocks_the_module_it_cannot_be_rewritten() -> None:
    # 0xFB (GC) instructions are not read on: the rewriter could not copy the body.
    data = HEADER + TYPE_SECTION + section(3, vec([b"\x00", b"\x00"]))
    data += section(10, vec([body(b"\x0b"), body(b"\xfb\x1c\x00\x00\x0b")]))
    wasm = decode(data, degrade=True)
    assert wasm.codes[0].readable and not wasm.codes[1].readable
    assert wasm.codes[1].body == [] and "GC" in str(wasm.offload_blocker())
    with pytest.raises(UnsupportedFeature, match="GC"):
        decode(data)


def test_rewriter_renumbers_tail_calls_and_keeps_tags() -> None:
    assert "return_call" in FUNC_INDEX_OPS
    data = wat(MIXED)
    wasm = load(data, degrade=True)
    from tensorwasm.compiler.rewrite import RegionExit

    # One region exit (an import) shifts every defined function by one.
    out = rewrite(wasm, [], [RegionExit(5, [0], "region_0")])
    again = load(out, degrade=True)
    assert [i.imm for i in again.codes[1].body if i.op.name == "return_call"] == [5]
    assert ("e", "tag") in [(e.name, e.kind) for e in again.exports]


def _big_invalid_module(instructions: int) -> bytes:
    code = b"\x41\x00\x1a" * instructions + b"\x42\x00\x0b"  # (i32.const 0, drop)*, then an i64 left over
    return HEADER + TYPE_SECTION + FUNC_SECTION + section(10, vec([body(code)]))


def test_load_validates_before_it_decodes_a_body() -> None:
    data = _big_invalid_module(100_000)  # 300 KB of code: 200 000 instructions
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError):
            load(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Decoding the body would hold 200 000 instruction objects (over 10 MB).
    assert peak < 8 * len(data), peak
    assert len(decode(data).codes[0].body) == 200_002  # (the eager decoder builds them)


def test_load_still_names_the_decoders_error_first() -> None:
    data = HEADER + TYPE_SECTION + FUNC_SECTION + section(10, vec([body(b"\x41\x00\x1a\x27\x0b")]))
    with pytest.raises(DecodeError, match="unknown opcode 0x27") as info:
        load(data)
    assert info.value.offset == len(data) - 2
    with pytest.raises(DecodeError, match="unknown opcode 0x27"):
        load(data, degrade=True)
