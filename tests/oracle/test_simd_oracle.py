"""The oracle's SIMD128 generators (``tensorwasm fuzz --simd``): what they generate, that
the unmodified compiler agrees with wasmtime on it bit for bit, on the host backend and
offloaded on the simulated device, and that planted SIMD miscompiles are found."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings

from tensorwasm.compiler.lower import simd
from tensorwasm.oracle.case import Call, Case, wasm_to_wat
from tensorwasm.oracle.cli import SIMD_GENERATOR_NAMES, add_parser
from tensorwasm.oracle.compare import run_case
from tensorwasm.oracle.fuzz import fuzz_generator
from tensorwasm.oracle.generators import (
    SIMD_GENERATORS,
    SIMD_OPS,
    canonicalize_lanes,
    generator_strategy,
    smith,
)
from tests.oracle.test_oracle import SHRINK_SECONDS, mutant


def _draw(name: str, examples: int) -> list[Case]:
    cases: list[Case] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(SIMD_GENERATORS[name]())
    def collect(case: Case) -> None:
        cases.append(case)

    collect()
    return cases


def _ops(text: str) -> set[str]:
    return set(re.findall(r"\b((?:v128|i8x16|i16x8|i32x4|i64x2|f32x4|f64x2)\.[a-z0-9_]+)", text))


def test_simd_functions_draw_from_every_simd_op() -> None:
    """Every SIMD row that computes on values is a choice of the generator, and a few
    hundred functions show a representative mix: saturating ops, shifts, compares,
    bitselect, shuffles, lanes, splats, float arithmetic, conversions, vector memory."""
    from tensorwasm.oracle.generators import LANE_MEMORY_OPS, SIMD_BY_RESULT

    drawable = {op.name for ops in SIMD_BY_RESULT.values() for op in ops}
    assert drawable == {op.name for op in SIMD_OPS} and len(drawable) > 190
    assert len(LANE_MEMORY_OPS) == 4
    seen: set[str] = set()
    for case in _draw("numeric", 150):
        seen |= _ops(case.text())
    assert len(seen & drawable) > len(drawable) // 2, len(seen & drawable)
    families = [r"add_sat", r"\.sh[lr]", r"\.(eq|lt_s|gt_u|le)$", r"bitselect", r"shuffle", r"swizzle",
                r"extract_lane", r"replace_lane", r"splat", r"^f(32x4|64x2)\.(add|mul|div|min|sqrt)",
                r"convert|trunc_sat|demote|promote", r"^v128\.store$", r"^v128\.load", r"_lane$"]  # fmt: skip
    for family in families:
        assert any(re.search(family, name) for name in seen), family


def test_simd_kernels_stride_16_bytes_with_vector_loads_and_stores() -> None:
    cases = _draw("loops", 30)
    texts = "\n".join(case.text() for case in cases)
    assert "local.get $i i32.const 4 i32.shl" in texts  # the element address: base + 16 * i
    assert texts.count("v128.store") >= len(cases) and "v128.load" in texts
    assert any(k["reduction"] for case in cases for k in case.meta["kernels"])
    assert {case.generator for case in cases} == {"simd-loops"}


def test_float_lanes_that_may_be_open_nans_are_canonicalised() -> None:
    """An f32x4.div whose lanes are NaNs from arithmetic: canonicalised, the vector's bits
    are fixed by Wasm, and we match wasmtime's exactly."""
    out = ["v128.const f32x4 0 inf -inf nan:0x200000", "v128.const f32x4 0 inf 1 2", "f32x4.div"]
    canonicalize_lanes("f32x4", out)
    body = "\n".join(out)
    wat = f'(module (memory (export "memory") 1) (func (export "f") (local $cv v128) (i32.const 0) {body} v128.store))'
    case = Case("simd", wat, [Call("f", ())])
    outcome = run_case(case)
    assert not outcome.failed and outcome.passed == 1, outcome.mismatch
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, case.wasm), [])
    instance.exports(store)["f"](store)
    memory = instance.exports(store)["memory"]
    lanes = bytes(memory.read(store, 0, 16))
    assert lanes == bytes.fromhex("0000c07f0000c07f000080ff0000c07f")  # 0/0, inf/inf, -inf/1, nan/2


def test_smith_with_simd_makes_vector_code() -> None:
    seeds = [bytes((k * 37 + j) % 256 for j in range(2048)) for k in range(16)]
    modules = [w for w in (smith(seed, simd=True) for seed in seeds) if w is not None]
    assert any("v128" in wasm_to_wat(w) for w in modules)
    assert not any("v128" in wasm_to_wat(w) for w in (smith(seed) for seed in seeds) if w is not None)


@pytest.mark.parametrize("name", SIMD_GENERATOR_NAMES)
def test_unmodified_compiler_passes_simd_cases(name: str, tmp_path: Path) -> None:
    report = fuzz_generator(name, max_examples=60, seed=7, save_dir=tmp_path, simd=True)
    assert not report.failures, report.failures[0].summary()
    assert report.calls > 0 and report.cases > 0


def test_simd_kernels_offload_on_the_simulated_device(tmp_path: Path) -> None:
    from tensorwasm.oracle.simulated import SimulatedOffloadInstance

    instances: list[SimulatedOffloadInstance] = []

    def factory(wasm: bytes) -> SimulatedOffloadInstance:
        instances.append(SimulatedOffloadInstance(wasm, filters=True))
        return instances[-1]

    report = fuzz_generator("loops", factory, max_examples=60, seed=11, save_dir=tmp_path, simd=True)
    assert not report.failures, report.failures[0].summary()
    assert sum(i.offloaded for i in instances) > 0, "no SIMD kernel was offloaded"


def test_only_generators_with_a_simd_variant_take_simd() -> None:
    assert tuple(SIMD_GENERATORS) == SIMD_GENERATOR_NAMES
    with pytest.raises(ValueError, match="no SIMD variant"):
        generator_strategy("control", simd=True)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["fuzz", "--simd", "--generator", "control", "--max-examples", "1"])
    assert args.run(args) == 2


def plant_vector_shift_mask(mp: pytest.MonkeyPatch) -> None:
    """Vector shift counts masked with the lane width instead of width - 1."""
    wrong = mutant(simd, "shift_count_mask", "ty.element.width - 1", "ty.element.width")
    for name in simd.SHIFT:
        mp.setitem(simd.SHIFT, name, wrong)


def plant_swizzle_in_range(mp: pytest.MonkeyPatch) -> None:
    """i8x16.swizzle that forgets the zero for indices of 16 and more."""
    wrong = mutant(
        simd, "swizzle_out_of_range_zero", "b.select(inside, byte, ir.Constant(byte.type, 0))", "byte"
    )
    mp.setitem(simd.BINARY, "i8x16.swizzle", wrong)


SIMD_TEETH = [
    (plant_vector_shift_mask, r"(i8x16|i16x8|i32x4|i64x2)\.sh[lr]"),
    (plant_swizzle_in_range, r"i8x16\.swizzle"),
]


@pytest.mark.parametrize(("plant", "culprit"), SIMD_TEETH, ids=[p.__name__[6:] for p, _ in SIMD_TEETH])
def test_planted_simd_miscompile_is_found_and_shrunk(
    plant, culprit: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    with monkeypatch.context() as mp:
        plant(mp)
        report = fuzz_generator(
            "numeric",
            max_examples=1500,
            seed=20240,
            shrink_seconds=SHRINK_SECONDS,
            save_dir=tmp_path,
            simd=True,
        )
        assert report.failures, f"the SIMD generator did not find {plant.__name__}"
        shrunk = report.failures[0].case
        assert re.search(culprit, shrunk.text()), shrunk.text()
        assert shrunk.programs == 1, shrunk.text()
        replayed = Case.load(report.failures[0].saved)
        assert run_case(replayed).failed
    assert not run_case(replayed).failed


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "backend"), [("numeric", "gpu"), ("smith", "gpu"), ("loops", "offload-gpu")]
)
def test_simd_cases_agree_on_the_gpu(name: str, backend: str, tmp_path: Path) -> None:
    report = fuzz_generator(name, backend, max_examples=60, seed=7, save_dir=tmp_path, simd=True)
    assert not report.failures, report.failures[0].summary()
    assert report.calls > 0
