"""The loops family's PolyBench shapes (``oracle.generators.SHAPES``) reach the analysis
that accepts them: a fixed draw of each shape's kernels, run offloaded from wasmtime to the
host backend, to the simulated device and (marker ``gpu``) to the GPU, agrees with wasmtime and is launched in the form
the shape is there for (a whole triangular or unrolled nest as one launch, an imperfect
nest distributed into phases, a sequential loop split into parallel phases, a time loop
over a stencil as a device-resident region), not declined everywhere."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorwasm.oracle.compare import run_case
from tensorwasm.oracle.generators import SHAPES, _loop_module, loop_cases, shaped_kernel
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.oracle.simulated import SimulatedOffloadInstance

# Derandomized: the same cases every run, so the counts asserted below do not depend on luck.
FIXED = settings(
    max_examples=10, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@st.composite
def _module_of(draw: st.DrawFn, shape: str):
    return _loop_module([draw(shaped_kernel(f"kernel{k}", k, shape)) for k in range(2)])


def _run_shape(shape: str, device: str) -> list[OffloadInstance]:
    instances: list[OffloadInstance] = []

    def factory(wasm: bytes) -> OffloadInstance:
        if device == "simulated":
            instance = SimulatedOffloadInstance(wasm)
        else:  # on the GPU, linear memory page-locked as `tensorwasm run` has it
            instance = OffloadInstance(wasm, device, pin=device == "gpu")
        instances.append(instance)
        return instance

    @FIXED
    @given(_module_of(shape))
    def check(case) -> None:
        assert {k["shape"] for k in case.meta["kernels"]} == {shape}
        outcome = run_case(case, factory)
        assert not outcome.failed, outcome.mismatch

    check()
    return instances


def _launched(instances: list[OffloadInstance]) -> list:
    return [lp for i in instances for lp in i.offload.loops if lp.stats.offloaded]


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_is_launched_as_its_shape(shape: str, device: str) -> None:
    instances = _run_shape(shape, device)
    launched = _launched(instances)
    assert launched, f"no {shape} loop was launched"
    outermost = [lp for lp in launched if lp.plan.loop.depth == 1]
    if shape in ("triangular", "unrolled"):
        # The whole nest, inner bounds affine in i (or bit masks of them), in one launch.
        assert outermost, f"no {shape} nest was launched whole"
    if shape == "imperfect" and device != "cpu":  # (the host's threads run whole iterations)
        assert any(lp.plan.phases for lp in outermost), "no imperfect nest was distributed into phases"
    if shape == "split":  # a sequential loop split into phases, launched once for all of it
        assert any(lp.plan.fission for lp in outermost), "no loop was split into parallel phases"
        if device != "cpu":  # and a stepped one (its iterations in order, phases in turn)
            assert any(lp.plan.stepped for lp in outermost), "no stepped loop was launched"
    if shape == "stencil":
        regions = [r for i in instances for r in i.offload.region_stats]
        assert sum(r.exits for r in regions) > 0, "no time loop ran as a device-resident region"
        if device != "cpu":
            assert sum(r.bytes_out for r in regions) > 0, "no region kept its results on the device"


def test_the_loops_family_draws_every_shape() -> None:
    seen: set[str] = set()

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(loop_cases())
    def draw(case) -> None:
        seen.update(k.get("shape", "rectangular") for k in case.meta["kernels"] if k["layout"] != "long")

    draw()
    assert seen == {*SHAPES, "rectangular"}


def test_the_loops_family_divides_by_constants_that_cannot_trap_and_that_may() -> None:
    # PolyBench's init loops divide by an inlined n: such a kernel cannot trap (the host keeps
    # nothing to undo); by 0 (or -1 under div_s) it may, and does.
    import re

    from tensorwasm.oracle.generators import _kernel

    divisions: list[tuple[str, int]] = []

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(_kernel("kernel0", 0))
    def draw(kernel) -> None:
        found = re.findall(r"\.(div_[su]|rem_[su]) .*?\((?:i32|i64)\.const (-?\d+)\)\)", kernel[0])
        divisions.extend((op, int(c)) for op, c in found)

    draw()
    total = [d for d in divisions if d[1] not in (0, -1)]
    trapping = [d for d in divisions if d[1] == 0 or d == ("div_s", -1)]
    assert total and trapping, divisions


@pytest.mark.parametrize("device", ["cpu", "simulated"])
def test_loop_kernels_that_divide_by_constants_match_wasmtime(device: str) -> None:
    from tensorwasm.oracle.generators import _kernel

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(_kernel("kernel0", 0).filter(lambda k: ".div_" in k[0] or ".rem_" in k[0]))
    def check(kernel) -> None:
        case = _loop_module([kernel])
        factory = (lambda wasm: OffloadInstance(wasm, "cpu")) if device == "cpu" else SimulatedOffloadInstance
        outcome = run_case(case, factory)
        assert not outcome.failed, outcome.mismatch

    check()
