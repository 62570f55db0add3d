"""Distribution and interchange of imperfect nests (compiler/analysis/schedule.py,
compiler/distribute.py): gemm's ``i { j: C *= beta; k { j: C += ... } }`` runs as phases
of a 2-D grid, each C[i][j] still scaled first and then summed over k in order, bit for
bit as wasmtime computes it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower.function import FunctionLowering, ModuleLowering, lower_loop_entry, reachable
from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.prepare import kernel_may_trap
from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget
from tensorwasm.dialect.types import F64, I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime.guards import GuardFailed, check
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import assemble, kernels, plans_ptx

DATA = (Path(__file__).parent / "data" / "distribute.wasm").read_bytes()
# The host backend, the GPU path's data movement on the host (simulated device), the GPU.
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
NI, NJ, NK = 20, 60, 40


def f64(x: float) -> tuple:
    return (F64, struct.unpack("<Q", struct.pack("<d", x))[0])


def outer_plans() -> dict:
    """Function name -> the plan (or None) of its outermost loop."""
    out = {}
    for r in analyze_module(translate_module(load(DATA))):
        if r.loop.depth == 1:
            out.setdefault(r.func.name, r.plan)
    return out


def test_gemm_is_distributed_into_two_phases_with_k_interchanged():
    plan = outer_plans()["gemm"]
    assert len(plan.phases) == 2
    scale, update = plan.phases
    assert scale.grid is scale.loop  # C *= beta: its own j loop is the grid
    assert update.grid is not update.loop and update.grid.parent is update.loop  # j inside k
    assert not plan.collapse


def test_interchange_alone_and_a_rejected_one():
    plans = outer_plans()
    for name in ("inter", "tri"):
        (phase,) = plans[name].phases
        assert phase.grid.parent is phase.loop
    (phase,) = plans["tri"].phases
    assert plans["tri"].counter in phase.trip.start.symbols()  # its rows differ in length
    # self_ref reads C[i][k], which the j loop of the same row writes: no thread may run
    # ahead of another, so the row stays in one thread.
    assert plans["self_ref"] is not None and plans["self_ref"].phases == ()


def run(device: str, calls: list, data: bytes = DATA, mode: str = "always") -> OffloadInstance:
    """``calls`` on module ``data`` offloaded to ``device`` (in offload ``mode``) and on
    wasmtime: every result and the whole memory equal."""
    reference = ReferenceInstance(data)
    offload = OffloadInstance(data, device=SimulatedDevice() if device == "simulated" else device, mode=mode)
    for export, args in calls:
        assert offload.call(export, args) == reference.call(export, args), export
    assert offload.memory() == reference.memory("memory")
    return offload


def outer_loop(loops, func: str):
    """Function ``func``'s outermost offloaded loop among ``loops``."""
    (lp,) = [lp for lp in loops if lp.plan.func.name == func and lp.plan.loop.depth == 1]
    return lp


def phases_on(device: str, phases: int) -> int:
    """The phases a plan has on ``device``: none on the host backend, whose threads run
    whole iterations (``AnalysisOptions.distribute``)."""
    return 0 if device == "cpu" else phases


def launches(instance: OffloadInstance, func: str) -> tuple[int, dict]:
    lp = outer_loop(instance.offload.loops, func)
    return lp.stats.offloaded, lp.stats.declined


def outer_reports(data: bytes) -> dict:
    """Function name -> the analysis report of its outermost loop in module ``data``."""
    out = {}
    for r in analyze_module(translate_module(load(data))):
        if r.loop.depth == 1:
            out.setdefault(r.func.name, r)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_gemm_matches_wasmtime(device):
    calls = [("init", []), ("gemm", [f64(1.5), f64(1.2)]), ("inter", [f64(0.75)]), ("tri", [f64(0.5)])]
    instance = run(device, calls)
    for name in ("gemm", "inter", "tri"):
        assert launches(instance, name) == (1, {}), name


def test_phase_kernels_cannot_trap():
    """A barrier waits for every thread of the block: a phase kernel has nothing that traps
    (its grid loop's count is tested without a division)."""
    module = translate_module(load(DATA))
    kernels = [
        outline(module, r.plan)
        for r in analyze_module(module)
        if r.plan is not None and r.plan.phases and not r.plan.fission
    ]
    assert len(kernels) == 4
    assert not any(kernel_may_trap(module, k.index) for k in kernels)


def phase_plans(data: bytes) -> tuple:
    """Module ``data`` translated, and the plans of its loops that run as phases."""
    module = translate_module(load(data))
    return module, [
        r.plan for r in analyze_module(module) if r.plan is not None and r.plan.phases and not r.plan.fission
    ]


def phase_kernel_bodies(module, plans: list, ptxas: str, tmp_path: Path) -> list[str]:
    """``plans``' kernels as PTX for sm_90, assembled by ptxas: each launch entry's body."""
    ptx = plans_ptx(module, plans, "sm_90")
    assemble(ptxas, ptx, "sm_90", tmp_path)
    return [body for name, body in kernels(ptx).items() if name.startswith("tw_kernel_")]


def address(instance: ReferenceInstance, which: int) -> int:
    """The address of C (0), A (1) or B (2)."""
    return instance.call("addr", [(I32, which)]).values[0][1]


@pytest.mark.parametrize("device", DEVICES)
def test_pointers_that_overlap_within_a_row_decline(device):
    """a == c (rows NJ wide): row i of a is row i of c, read at every k while the row's
    threads write it; rows do not meet each other, so only the row guard refuses."""
    reference = ReferenceInstance(DATA)
    c, b = address(reference, 0), address(reference, 2)
    calls = [("init", []), ("gemm_ptr", [(I32, c), (I32, c), (I32, b), f64(1.5), f64(1.2)])]
    instance = run(device, calls)
    offloaded, declined = launches(instance, "gemm_ptr")
    if phases_on(device, 2):
        assert offloaded == 0 and any("within one iteration" in reason for reason in declined)
    else:  # the host's thread runs the whole row in Wasm order: nothing for the row guard to refuse
        assert (offloaded, declined) == (1, {})
    # Apart (a past the end of B), the same call runs distributed.
    apart = b + 8 * NK * NJ
    instance = run(
        device, [("init", []), ("gemm_ptr", [(I32, c), (I32, apart), (I32, b), f64(1.5), f64(1.2)])]
    )
    assert launches(instance, "gemm_ptr") == (1, {})


def test_the_row_guard_compares_one_iteration_of_each_access():
    plan = outer_plans()["gemm_ptr"]
    assert plan.row_guarded
    param = {index: sym for _, sym, kind, index in plan.live_ins if kind == "local"}
    base = 1 << 16
    env = {param[0]: base, param[1]: base + 8, param[2]: base + (1 << 15)}
    with pytest.raises(GuardFailed, match="within one iteration"):
        check(plan, env, 1 << 20, strict_alignment=False)
    env[param[1]] = base + (1 << 14)  # past the end of c
    assert check(plan, env, 1 << 20, strict_alignment=False).rows


def test_phase_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module = translate_module(load(DATA))
    plans = [
        r.plan for r in analyze_module(module) if r.plan is not None and r.plan.phases and not r.plan.fission
    ]
    assert {p.func.name for p in plans} == {"gemm", "gemm_ptr", "inter", "tri"}
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    lowering = ModuleLowering(module, target)
    kernels = [outline(module, plan) for plan in plans]
    for index in reachable(module, [k.index for k in kernels]):
        FunctionLowering(lowering, module.functions[index]).lower()
    for kernel in kernels:
        lower_loop_entry(lowering, kernel.index, [])
    ptx = target.emit_ptx(str(lowering.llvm))
    assemble(ptxas, ptx, "sm_90", tmp_path)
    gemm = ptx[ptx.index(".entry tw_kernel_" + str(kernels[0].index)) :]
    gemm = gemm[: gemm.index("\n}")]
    assert gemm.count("barrier.sync") == 1  # between its two phases
    assert "bar.sync" not in gemm  # the aligned form needs converged warps
    assert "%ctaid.x" in gemm and "%tid.x" in gemm  # a block per row, its threads share a phase
