"""Cost linear in loop nesting depth: loop headers take arguments only for the locals live
at them (pruned SSA), and functions nested too deep for LLVM's loop passes are lowered
``optnone`` with their code generated at level 0, said in the compile manifest."""

from __future__ import annotations

import json

import pytest

from tensorwasm.compiler import aot
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.frontend.translate import loop_assignments
from tensorwasm.compiler.lower.function import MAX_OPTIMISED_LOOP_DEPTH, ModuleLowering
from tensorwasm.compiler.target import HostTarget, NVPTXTarget
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat


def counted_nest(depth: int) -> str:
    """``f(n)``: ``depth`` counted loops nested, each with its own counter (reset before it
    starts, as clang writes them), the innermost adding the counters into memory[0]."""
    locals_ = " ".join(f"(local $i{k} i32)" for k in range(depth))
    opens = "".join(
        f"(local.set $i{k} (i32.const 0)) (block $b{k} (loop $l{k}"
        f" (br_if $b{k} (i32.ge_u (local.get $i{k}) (local.get $n)))\n"
        for k in range(depth)
    )
    total = "(local.get $i0)"
    for k in range(1, depth):
        total = f"(i32.add {total} (i32.mul (local.get $i{k}) (i32.const {k + 1})))"
    body = f"(i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) {total}))\n"
    tails = "".join(
        f"(local.set $i{k} (i32.add (local.get $i{k}) (i32.const 1))) (br $l{k})))\n"
        for k in reversed(range(depth))
    )
    return (
        f'(module (memory (export "memory") 1) (func (export "f") (param $n i32) (result i32) {locals_}\n'
        f"{opens}{body}{tails} (i32.load (i32.const 0))))"
    )


def headers(data: bytes) -> list[list[int]]:
    body = load(data).codes[0].body
    found = loop_assignments(body)
    return [found[i] for i, x in enumerate(body) if x.op.name == "loop"]


def test_a_nest_of_counted_loops_carries_one_counter_per_header() -> None:
    # Local 0 is n; loop k counts local k+1, and sets local k+2 (the inner counter) before
    # the inner loop: dead at its header, it needs no argument there, nor further out.
    assert headers(wat(counted_nest(5))) == [[1], [2], [3], [4], [5]]
    function = translate_module(load(wat(counted_nest(5)))).function("f")
    assert [len(info.header.args) for info in function.loops] == [1] * 5


@pytest.mark.parametrize(
    ("why", "loop", "expected"),
    [
        # read after the loop, which an exit leaves before the reset: live at the header
        ("read after", "(loop $l (br_if $x (local.get 0)) (local.set 1 (i32.const 7)) (br $l))", [1]),
        # the first write is inside an if: a path skips it
        ("conditional", "(loop $l (if (local.get 0) (then (local.set 1 (i32.const 7)))) "
         "(br_if $x (local.get 1)) (br $l))", [1]),
        # read before the write in the loop
        ("read first", "(loop $l (br_if $x (local.get 1)) (local.set 1 (i32.const 7)) (br $l))", [1]),
    ],
)  # fmt: skip
def test_a_local_live_at_the_header_keeps_its_argument(why: str, loop: str, expected: list[int]) -> None:
    text = f"(module (func (param i32) (result i32) (local i32) (block $x {loop}) (local.get 1)))"
    if why != "read after":
        text = text.replace("(local.get 1)))", "(i32.const 0)))")
    assert headers(wat(text)) == [expected]


PRUNED = """(module (memory (export "memory") 1)
  (func (export "after") (param $n i32) (result i32) (local $i i32) (local $t i32)
    (block $x (loop $l
      (br_if $x (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $t (i32.mul (local.get $i) (i32.const 3)))
      (i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (local.get $t)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (i32.add (local.get $t) (i32.load (i32.const 0))))
  (func (export "scoped") (param $n i32) (result i32) (local $i i32) (local $t i32)
    (block $x (loop $l
      (br_if $x (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $t (i32.mul (local.get $i) (i32.const 3)))
      (i32.store (i32.const 4) (i32.add (i32.load (i32.const 4)) (local.get $t)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (i32.load (i32.const 4))))"""


def test_pruned_and_kept_arguments_compute_what_wasmtime_does() -> None:
    data = wat(PRUNED)
    module = load(data)
    # $t is read after the loop in "after" (kept), nowhere outside it in "scoped" (pruned)
    assert [loop_assignments(code.body) for code in module.codes] == [{1: [1, 2]}, {1: [1]}]
    host, reference = HostExecutor(data), ReferenceInstance(data)
    for name in ("after", "scoped"):
        for n in (0, 1, 5):
            assert host.call(name, [(I32, n)]) == reference.call(name, [(I32, n)]), (name, n)
    data = wat(counted_nest(4))
    host, reference = HostExecutor(data), ReferenceInstance(data)
    for n in (0, 1, 3):
        assert host.call("f", [(I32, n)]) == reference.call("f", [(I32, n)]), n


def _lowered(depth: int, target) -> str:
    module = translate_module(load(wat(counted_nest(depth))))
    lowering = ModuleLowering(module, target)
    lowering.lower_entries([0])
    return str(lowering.llvm)


def _definition(llvm_ir: str) -> str:
    return next(line for line in llvm_ir.splitlines() if line.startswith('define internal i32 @"wasm_f0"'))


def test_a_function_nested_too_deep_is_lowered_unoptimised() -> None:
    assert "optnone" not in _definition(_lowered(MAX_OPTIMISED_LOOP_DEPTH, HostTarget()))
    assert _definition(_lowered(MAX_OPTIMISED_LOOP_DEPTH + 1, HostTarget())).endswith("noinline optnone")


def test_code_generation_drops_to_level_0_only_for_an_unoptimised_function() -> None:
    target = NVPTXTarget("sm_90", (7, 8))
    shallow = target.parse(_lowered(3, target))
    deep = target.parse(_lowered(MAX_OPTIMISED_LOOP_DEPTH + 1, target))
    assert target.codegen_machine(shallow) is target.target_machine()
    assert target.codegen_machine(deep) is target.unoptimised_machine()
    assert target.unoptimised_machine() is not target.target_machine()


def test_a_deep_nest_runs_as_wasmtime_does_on_the_host(monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    data = wat(counted_nest(MAX_OPTIMISED_LOOP_DEPTH + 6))
    host, reference = HostExecutor(data), ReferenceInstance(data)
    assert "optnone" in host.compilation.llvm_ir
    for n in (0, 1):
        assert host.call("f", [(I32, n)]) == reference.call("f", [(I32, n)]), n


def test_the_manifest_says_which_kernels_were_not_optimised(tmp_path) -> None:
    deep, shallow = counted_nest(MAX_OPTIMISED_LOOP_DEPTH + 1), counted_nest(2)
    # two modules' functions in one: "f" nested too deep, "g" two loops deep
    text = deep[: deep.rindex(")")] + shallow[shallow.index("(func") : shallow.rindex(")")].replace(
        '"f"', '"g"'
    )
    path = tmp_path / "deep.wasm"
    path.write_bytes(wat(text + ")"))
    aot.compile_to_directory(path, tmp_path / "out", target="sm_90")
    rows = {
        row["function"]: row
        for row in json.loads((tmp_path / "out" / "manifest.json").read_text())["kernels"]
    }
    assert rows["f"]["optimisation"] == (
        f"none: loops nested over {MAX_OPTIMISED_LOOP_DEPTH} deep in f ({MAX_OPTIMISED_LOOP_DEPTH + 1} deep);"
        " code generation at level 0"
    )
    assert rows["g"]["optimisation"].startswith("O2, code generation at level 0")
    assert ".entry tw_call_0" in (tmp_path / "out" / "deep.sm_90.ptx").read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [4, MAX_OPTIMISED_LOOP_DEPTH + 6])
def test_a_nest_runs_as_wasmtime_does_on_the_gpu(monkeypatch, depth: int) -> None:
    # 4 deep: pruned header arguments through the optimised PTX; 70 deep: the optnone
    # function in PTX generated at level 0.
    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    data = wat(counted_nest(depth))
    gpu, reference = GPUExecutor(data), ReferenceInstance(data)
    for n in (0, 1, 2) if depth < 10 else (0, 1):
        assert gpu.call("f", [(I32, n)]) == reference.call("f", [(I32, n)]), n
        assert gpu.memory()[:4] == reference.memory("memory")[:4], n
