"""The declared pipeline: its stages and their records, the runner (stop, dump, resume),
its users (AOT, inspect, the offload preparation) agreeing with each other and with the
runtime's own preparation, the prepared-module cache's record, and the compiler's
independence from the runtime."""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.aot import choose_targets, compile_to_directory
from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.prepare import PreparedModule, compile_loop_kernels, prepare_offload
from tensorwasm.compiler.target import ARCH_PTX, HostTarget, NVPTXTarget
from tensorwasm.runtime import cli, prepared
from tests.conftest import ROOT, wat
from tests.offload_cases import module_bytes

SAXPY = """(module (memory (export "memory") 1)
  (func $twice (param f32) (result f32) local.get 0 local.get 0 f32.add)
  (func (export "saxpy") (param $n i32) (param $a f32) (param $x i32) (param $y i32) (local $i i32)
    (loop $l
      (f32.store (i32.add (local.get $y) (i32.shl (local.get $i) (i32.const 2)))
        (f32.add (f32.mul (local.get $a) (f32.load (i32.add (local.get $x) (i32.shl (local.get $i) (i32.const 2)))))
                 (call $twice (f32.load (i32.add (local.get $y) (i32.shl (local.get $i) (i32.const 2)))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""

SM80 = NVPTXTarget("sm_80", ARCH_PTX["sm_80"])
ORDER = ["wasm", "dialect", "loops", "kernels", "llvm", "ptx", "native"]


def numbered_alike(ptx: str) -> str:
    """PTX with its call sequences' numbers taken out: LLVM numbers them on from one
    compilation to the next in a process."""
    return re.sub(r"callseq \d+", "callseq", ptx)


def test_the_stages_in_order_and_the_ones_inspect_prints() -> None:
    assert list(pipeline.STAGES) == ORDER
    assert all(name == stage.name for name, stage in pipeline.STAGES.items())
    parser = cli.build_parser("inspect")
    (inspect,) = parser._subparsers._group_actions[0].choices.values()
    (stage,) = [a for a in inspect._actions if a.dest == "stage"]
    assert stage.choices == pipeline.printable_stages() == ["wasm", "dialect", "loops", "llvm", "ptx"]


@pytest.mark.parametrize("name", ORDER)
def test_stopping_after_each_stage_gives_its_record_and_nothing_later(name: str) -> None:
    target = HostTarget() if name == "native" else SM80
    request = pipeline.Request(wat(SAXPY), entries=pipeline.LOOPS, target=target)
    state = pipeline.run(request, name)
    assert isinstance(getattr(state, name), pipeline.STAGES[name].result)
    later = ORDER[ORDER.index(name) + 1 :]
    assert all(getattr(state, other) is None for other in later)
    if name in ("wasm", "dialect", "loops", "llvm", "ptx"):
        text = pipeline.STAGES[name].show(getattr(state, name), pipeline.View())
        assert text.strip()


def test_the_runner_hands_each_stage_to_the_dump_in_order_and_passes_over_what_does_not_apply() -> None:
    seen = []
    request = pipeline.Request(wat(SAXPY), target=SM80)  # whole functions: no loop analysis
    state = pipeline.run(request, dump=lambda stage, result: seen.append((stage.name, result)))
    assert [name for name, _ in seen] == ["wasm", "dialect", "kernels", "llvm", "ptx"]
    assert all(result is getattr(state, name) for name, result in seen)
    assert state.loops is None and state.native is None
    assert ".target sm_80" in state.ptx.text
    assert set(state.ptx.entries.values()) == {"tw_call_0", "tw_call_1"}


def test_a_stage_the_request_does_not_need_cannot_be_the_stop() -> None:
    with pytest.raises(CompileError, match="loops stage does not apply"):
        pipeline.run(pipeline.Request(wat(SAXPY)), "loops")
    with pytest.raises(CompileError, match="native stage does not apply"):
        pipeline.run(pipeline.Request(wat(SAXPY), target=SM80), "native")
    with pytest.raises(CompileError, match="no stage 'cubin'"):
        pipeline.run(pipeline.Request(wat(SAXPY)), "cubin")


def test_a_resumed_state_compiles_as_one_run_does() -> None:
    data = wat(SAXPY)
    whole = pipeline.run(pipeline.Request(data, target=SM80))
    request = pipeline.Request(data)
    state = pipeline.run(request, "kernels")
    assert state.llvm is None
    again = pipeline.run(pipeline.Request(data, target=SM80), state=state)
    assert again is state and numbered_alike(state.ptx.text) == numbered_alike(whole.ptx.text)
    assert pipeline.run(request, "wasm", state=state) is state  # nothing left to run up to there


def test_aot_inspect_and_compile_entries_give_the_same_ptx(tmp_path: Path, capsys) -> None:
    src = ROOT / "examples/loops/build/blas1.O2.wasm"
    manifest = compile_to_directory(src, tmp_path, "sm_80")
    written = (tmp_path / manifest["kernels"][0]["file"]).read_text()
    assert cli.main(["inspect", str(src), "--stage", "ptx", "--target", "sm_80"]) == 0
    assert numbered_alike(capsys.readouterr().out) == numbered_alike(written)
    state = pipeline.run(pipeline.Request(src.read_bytes()), "dialect")
    module = state.dialect.module
    compilation = pipeline.compile_entries(module, SM80, pipeline.defined_functions(module))
    assert numbered_alike(compilation.ptx) == numbered_alike(written)
    assert {k["kernel"] for k in manifest["kernels"]} == set(compilation.entries.values())
    assert pipeline.PTXCode(written, {}).sha256 == manifest["kernels"][0]["sha256"]


def test_compile_takes_the_gpus_target_from_the_command_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "_device_target", lambda: SM80)
    src = tmp_path / "m.wat"
    src.write_text('(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul))')
    assert cli.main(["compile", str(src), "-o", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out/manifest.json").read_text())["targets"] == ["sm_80"]
    assert "for sm_80" in capsys.readouterr().out
    assert choose_targets(None, None) == [NVPTXTarget(a, ARCH_PTX[a]) for a in ("sm_75", "sm_80", "sm_90")]
    assert choose_targets("sm_75", SM80) == [NVPTXTarget("sm_75", ARCH_PTX["sm_75"])]


def test_inspect_loops_prints_the_analysis_the_offload_preparation_runs(capsys) -> None:
    data = module_bytes("reductions", "O2")
    prepared_module = prepare_offload(data, AnalysisOptions(relaxed_float=True)).prepared
    src = ROOT / "examples/loops/build/reductions.O2.wasm"
    assert cli.main(["inspect", str(src), "--stage", "loops", "--format", "json", "--relaxed-float"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == [r.as_json() for r in prepared_module.reports]
    assert any(r["verdict"] == "offload" for r in printed)


@pytest.mark.parametrize("program", ["blas1", "stencil", "reductions"])
def test_the_offload_preparation_matches_the_runtimes_own(program: str, monkeypatch) -> None:
    """Same loops, kernels, host calls, regions, rewritten module and host code as
    OffloadModule's preparation (the cache off, ``TENSORWASM_CACHE=off``, until the last
    kernel is compared: it prepares and compiles afresh, each kernel at its first need)."""
    from tensorwasm.runtime.offload import OffloadModule

    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    data = module_bytes(program, "O2")
    runtime = OffloadModule(data, device="cpu")
    preparation = prepare_offload(data, AnalysisOptions(distribute=False))  # (as the host backend prepares)
    ours = preparation.prepared
    assert ours.loops, "the example must offload something"
    assert [(r.func.name, r.loop.offset, r.verdict, r.reason) for r in ours.reports] == [
        (r.func.name, r.loop.offset, r.verdict, r.reason) for r in runtime.reports
    ]
    assert [(lp.kernel_index, lp.insertion, lp.region, lp.entry(False)) for lp in ours.loops] == [
        (lp.kernel_index, lp.insertion, lp.stats.region, lp.entry) for lp in runtime.loops
    ]
    assert ours.host_sigs == runtime._host_sigs
    # A region read from the cache is a record of the same fields.
    fields = ("func_index", "start", "end", "offset", "children", "exits")
    assert [[getattr(r, f) for f in fields] for r in ours.regions] == [
        [getattr(r, f) for f in fields] for r in runtime.regions
    ]
    assert ours.rewritten == runtime.rewritten
    native = compile_loop_kernels(preparation, HostTarget())
    assert sorted(native.entries.values()) == sorted(lp.entry for lp in runtime.loops)
    for lp in runtime.loops:  # each kernel compiled on its own, as the runtime compiles it
        alone = compile_loop_kernels(preparation, HostTarget(), [lp.kernel_index])
        assert alone.entries == {lp.kernel_index: lp.entry}
        assert alone.obj == runtime.kernels.unit(lp.kernel_index).host_object
    ptx = compile_loop_kernels(preparation, SM80)
    assert ptx.text.count(".entry") == len(ours.loops)
    assert sorted(ptx.entries.values()) == sorted(lp.entry(True) for lp in ours.loops)


def test_a_module_without_loops_prepares_to_itself() -> None:
    data = wat('(module (func (export "f") (param i32) (result i32) local.get 0))')
    ours = prepare_offload(data).prepared
    assert ours.rewritten == data and ours.loops == () and ours.reports == () and ours.regions == ()


def test_the_prepared_module_round_trips_slimmed_through_the_cache_record() -> None:
    ours = prepare_offload(module_bytes("stencil", "O2"), AnalysisOptions()).prepared
    back = prepared.load(prepared.dump(ours))
    assert isinstance(back, PreparedModule)
    assert back.rewritten == ours.rewritten and back.host_sigs == ours.host_sigs
    assert [(lp.kernel_index, lp.insertion, lp.region) for lp in back.loops] == [
        (lp.kernel_index, lp.insertion, lp.region) for lp in ours.loops
    ]
    assert [(r.func.name, r.loop.offset, r.verdict) for r in back.reports] == [
        (r.func.name, r.loop.offset, r.verdict) for r in ours.reports
    ]
    for lp in back.loops:
        assert lp.plan.blocks == set() and all(level.blocks == set() for level in lp.plan.collapse)
        assert len([r for r in back.reports if r.plan is lp.plan]) == 1  # still its report's own plan
    assert all(lp.plan.blocks for lp in ours.loops)  # the module itself keeps its plans whole


def test_an_unreadable_or_incomplete_prepared_entry_is_none() -> None:
    ours = prepare_offload(module_bytes("blas1", "O2"), AnalysisOptions()).prepared
    assert prepared.load(b"not a pickle") is None
    assert prepared.load(pickle.dumps(["not", "a", "prepared", "module"])) is None
    vars(ours.loops[0]).pop("region")  # as a record of an older version would be read back
    assert prepared.load(prepared.dump(ours)) is None


def test_the_compiler_imports_nothing_from_the_runtime() -> None:
    found = []
    for path in sorted((ROOT / "compiler").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            found += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name in ("tensorwasm.runtime", "runtime")
                or name.startswith(("tensorwasm.runtime.", "runtime."))
            ]
    assert found == []
