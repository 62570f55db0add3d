"""The loop detector: verdicts and reasons on the example corpus and on small loops."""

from __future__ import annotations

import json

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.runtime.cli import main
from tests.conftest import ROOT, wat
from tests.offload_cases import module_bytes

SUITE = ROOT / "benchmarks/suite/build"


def reports(data: bytes, relaxed: bool = False):
    return analyze_module(translate_module(load(data)), AnalysisOptions(relaxed_float=relaxed))


def by_func(data: bytes, relaxed: bool = False) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in reports(data, relaxed):
        out.setdefault(r.func.name, []).append(r)
    return out


REJECTS = {
    "prefix_sum": ("carried", "overlap"),
    "gauss_seidel": ("carried", "overlap"),
    "histogram": ("computed from memory", "not affine"),
    "find_first": ("returns", "early exit", "ways out"),
    "log_each": ("calls import env.log_value",),
}


# Loops whose conflict hides behind base pointers the analysis cannot relate (clang -O2
# derives two bases of one array): accepted with guards that refuse them at run time.
GUARD_REJECTS = {"gauss_seidel": (["m", "n", ("f32", "mn")], "may overlap")}


@pytest.mark.parametrize("level", ["O0", "O1", "O2"])
def test_loops_that_must_stay_sequential_are_rejected_with_a_reason(level: str) -> None:
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import Case, run_case

    funcs = by_func(module_bytes("reject", level))
    offload = OffloadModule(module_bytes("reject", level), device="cpu")
    for name, keywords in REJECTS.items():
        for report in funcs[name]:
            if report.verdict == "offload" and name in GUARD_REJECTS:
                spec, reason = GUARD_REJECTS[name]
                case = Case({"m": 12, "n": 9, "k": 1}, [0.0] * len(spec), [0], seed=3)
                assert run_case(offload.rewritten, name, spec, case, offload) == run_case(
                    module_bytes("reject", level), name, spec, case
                )
                loop = next(lp for lp in offload.loops if lp.stats.offset == report.loop.offset)
                assert loop.stats.offloaded == 0 and any(reason in r for r in loop.stats.declined)
                continue
            assert report.verdict == "reject", (name, report.reason)
            if level != "O0":
                assert any(k in report.reason for k in keywords), (name, report.reason)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_parallel_loops_are_accepted(level: str) -> None:
    must = ["saxpy", "daxpy", "sscal", "idot", "relu", "clamp", "abs_or_double", "isum", "imin",
            "imax", "ixor", "jacobi1d", "jacobi2d", "jacobi3d"]  # fmt: skip
    merged = {}
    for mod in ("blas1", "maps", "reductions", "stencil"):
        merged.update(by_func(module_bytes(mod, level)))
    for name in must:
        assert any(r.verdict == "offload" for r in merged[name]), (name, [r.reason for r in merged[name]])


def test_float_reduction_needs_relaxed_float() -> None:
    strict = by_func(module_bytes("reductions", "O2"))["fsum"]
    assert all(r.verdict == "reject" and "needs --relaxed-float" in r.reason for r in strict)
    relaxed = by_func(module_bytes("reductions", "O2"), relaxed=True)["fsum"]
    assert any(r.verdict == "offload" and "fadd" in r.reason for r in relaxed)


LOOP = """
(module (memory (export "memory") 1)
  (func (export "f") (param $n i32) (param $p i32) (local $i i32)
    (block $done (loop $l
      local.get $i local.get $n i32.ge_u br_if $done
      {body}
      local.get $i i32.const 1 i32.add local.set $i br $l))))
"""


def one_loop(body: str):
    (report,) = reports(wat(LOOP.format(body=body)))
    return report


def test_shifted_store_is_a_dependence_with_offsets() -> None:
    # a[i+1] = a[i]: the store of one iteration is the load of the next.
    report = one_loop(
        "local.get $p local.get $i i32.const 2 i32.shl i32.add "
        "local.get $p local.get $i i32.const 2 i32.shl i32.add i32.load "
        "i32.store offset=4"
    )
    assert report.verdict == "reject"
    assert "store at +0x" in report.reason and "may overlap load at +0x" in report.reason


def test_independent_map_is_accepted_with_trip_count() -> None:
    report = one_loop(
        "local.get $p local.get $i i32.const 2 i32.shl i32.add "
        "local.get $p local.get $i i32.const 2 i32.shl i32.add i32.load i32.const 3 i32.mul "
        "i32.store"
    )
    assert report.verdict == "offload"
    assert report.trip.describe() == "(local0)"
    assert report.as_json()["trip_count"] == "(local0)"


def test_memory_grow_in_loop_is_rejected() -> None:
    report = one_loop("i32.const 0 memory.grow drop")
    assert report.verdict == "reject" and "memory.grow" in report.reason


def test_loops_report_text_and_json(capsys) -> None:
    path = ROOT / "examples/loops/build/reject.O2.wasm"
    assert main(["inspect", str(path), "--stage", "loops"]) == 0
    text = capsys.readouterr().out
    assert "log_each +0x" in text and "reject" in text and "calls import env.log_value" in text
    assert main(["inspect", str(path), "--stage", "loops", "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"func", "offset", "depth", "trip_count", "verdict", "reason"} <= set(rows[0])
    assert {r["verdict"] for r in rows if r["func"] not in GUARD_REJECTS} == {"reject"}


@pytest.mark.parametrize(
    ("mod", "level", "func", "collapsed"),
    [
        ("blas3", "O2", "sgemm", True), ("blas3", "O2", "dgemm", True),
        ("stencil", "O1", "jacobi2d", True), ("stencil", "O2", "jacobi2d", True),
        ("blas2", "O2", "sgemv", 1),  # the inner loop is a (float) reduction
        ("stencil", "O2", "jacobi1d", 1),  # no inner loop
        ("stencil", "O1", "jacobi3d", 3),  # its hoisted test of ny comes in as a local's 0 or 1
        ("stencil", "O2", "jacobi3d", 3),  # exit tests on a compare kept in a local (eqz)
        ("suite", "O2", "kernel_stencil3d", 3),
    ],
)  # fmt: skip
def test_perfect_parallel_nests_collapse_into_a_2d_or_3d_grid(mod, level, func, collapsed) -> None:
    wasm = (SUITE / "stencil3d.wasm").read_bytes() if mod == "suite" else module_bytes(mod, level)
    outer = min((r for r in by_func(wasm)[func] if r.verdict == "offload"),
                key=lambda r: r.loop.depth)  # fmt: skip
    dims = 1 + len(outer.plan.collapse)
    assert dims == (2 if collapsed is True else collapsed), outer.reason
    parent = outer.loop
    for level_ in outer.plan.collapse:  # each level the only child of the one before
        assert level_.loop.parent is parent
        parent = level_.loop
    assert (f"{dims}-D grid" in outer.reason) == (dims > 1)


def test_a_store_outside_the_inner_loop_keeps_the_nest_1d() -> None:
    data = wat("""(module (memory (export "memory") 1)
      (func (export "f") (param $n i32) (local $i i32) (local $j i32)
        (loop $outer
          (i32.store (i32.mul (local.get $i) (i32.const 4)) (local.get $i))
          (local.set $j (i32.const 0))
          (loop $inner
            (i32.store (i32.add (i32.const 4096) (i32.shl (i32.add (i32.mul (local.get $i) (i32.const 64))
                       (local.get $j)) (i32.const 2))) (local.get $j))
            (br_if $inner (i32.lt_s (local.tee $j (i32.add (local.get $j) (i32.const 1))) (i32.const 64))))
          (br_if $outer (i32.lt_s (local.tee $i (i32.add (local.get $i) (i32.const 1))) (local.get $n))))))""")
    (outer, inner) = sorted(reports(data), key=lambda r: r.loop.depth)
    assert outer.verdict == "offload" and inner.verdict == "offload", (outer.reason, inner.reason)
    assert outer.plan.collapse == ()


def test_a_comparison_hoisted_before_the_loop_is_recomputed_in_the_kernel() -> None:
    # clang hoists blur's bounds test out of the row loop; no local holds its result.
    rows = reports((ROOT / "examples/wasi/build/blur.O2.wasm").read_bytes())
    outer = next(r for r in rows if r.func.name == "main" and r.loop.offset == 0x3F8)
    assert outer.verdict == "offload" and outer.plan.collapse, outer.reason
