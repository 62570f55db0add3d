"""Recursion as deep as real programs need: the stack sized from frame sizes, the depth limit
carried by the context block, and exhaustion trapping cleanly on the host and the GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tensorwasm.compiler.lower import abi
from tensorwasm.dialect.types import I32, I64
from tensorwasm.runtime import assembler
from tensorwasm.runtime.executor import (
    GPU_MAX_STACK_BYTES,
    GPU_STACK_BYTES,
    GPU_TARGET_CALL_DEPTH,
    HOST_CALL_DEPTH,
    STACK_MARGIN_BYTES,
    GPUExecutor,
    HostExecutor,
    native_stack_floor,
    plan_stack,
    resident_threads,
)
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

EVEN_ODD = wat(
    "(module"
    ' (func $even (export "even") (param i64) (result i32)'
    "   (if (result i32) (i64.eqz (local.get 0)) (then (i32.const 1))"
    "     (else (call $odd (i64.sub (local.get 0) (i64.const 1))))))"
    ' (func $odd (export "odd") (param i64) (result i32)'
    "   (if (result i32) (i64.eqz (local.get 0)) (then (i32.const 0))"
    "     (else (call $even (i64.sub (local.get 0) (i64.const 1))))))"
    ' (func $inf (export "inf") (param i32) (result i32) local.get 0 call $inf)'
    ' (func (export "inc") (param i32) (result i32) local.get 0 i32.const 1 i32.add))'
)


def big_frames(locals_count: int = 256) -> bytes:
    """A function that recurses without end, with ``locals_count`` i64 locals all live at
    once (loaded, then stored): a large stack frame per call (skip-stack-guard-page's shape)."""
    loads = "".join(f"(local.set {i} (i64.load offset={i} (i32.const 0)))" for i in range(locals_count))
    stores = "".join(f"(i64.store offset={8 * i} (i32.const 0) (local.get {i}))" for i in range(locals_count))
    return wat(
        "(module (memory 1)"
        f' (func $deep (export "deep") (local {" ".join(["i64"] * locals_count)})'
        f"   call $deep {loads} {stores})"
        ' (func (export "inc") (param i32) (result i32) local.get 0 i32.const 1 i32.add))'
    )


def expected(wasm: bytes, name: str, args) -> object:
    return ReferenceInstance(wasm).call(name, args)


# -- the stack plan ----------------------------------------------------------------------


def test_small_frames_reach_the_target_depth_within_the_budget() -> None:
    plan = plan_stack([0, 32, 0, 32], budget=1 << 20, current=1024)
    fixed = 64 + STACK_MARGIN_BYTES
    assert plan.stack_bytes == fixed + GPU_TARGET_CALL_DEPTH * 32
    assert plan.depth_limit == GPU_TARGET_CALL_DEPTH


def test_the_depth_is_what_the_budget_allows_when_it_is_lower() -> None:
    plan = plan_stack([56], budget=100_000, current=1024)
    assert plan.stack_bytes == 100_000
    assert plan.depth_limit == (100_000 - 56 - STACK_MARGIN_BYTES) // 56


def test_large_frames_are_capped_by_the_hardware_limit_and_counted_by_the_largest() -> None:
    frames = [0, 48, 13_424, 8]
    plan = plan_stack(frames, budget=1 << 30, current=1024)
    assert plan.stack_bytes == GPU_MAX_STACK_BYTES
    assert plan.depth_limit == (GPU_MAX_STACK_BYTES - sum(frames) - STACK_MARGIN_BYTES) // 13_424
    assert plan.depth_limit * 13_424 + sum(frames) + STACK_MARGIN_BYTES <= plan.stack_bytes


def test_the_stack_never_shrinks_and_a_larger_one_allows_more_depth() -> None:
    plan = plan_stack([64], budget=20_000, current=400_000)
    assert plan.stack_bytes == 400_000
    assert plan.depth_limit == (400_000 - 64 - STACK_MARGIN_BYTES) // 64
    assert plan_stack([], budget=0, current=0).stack_bytes == GPU_STACK_BYTES


def test_a_frame_larger_than_any_stack_allows_no_recursive_call() -> None:
    assert plan_stack([GPU_MAX_STACK_BYTES], budget=1 << 30, current=1024).depth_limit == 0


def test_resident_threads_by_capability() -> None:
    assert resident_threads((9, 0), 132) == 132 * 2048
    assert resident_threads((7, 5), 40) == 40 * 1024


# -- frame sizes ---------------------------------------------------------------------------


def test_ptx_frame_bounds_count_registers_parameters_and_depot() -> None:
    ptx = (
        b".func (.param .b32 func_retval0) f(\n\t.param .b64 f_param_0\n)\n{\n"
        b"\t.local .align 8 .b8 \t__local_depot0[40];\n\t.reg .pred \t%p<3>;\n\t.reg .b64 \t%rd<10>;\n}\n"
        b".visible .entry k(\n)\n{\n\t.reg .b32 \t%r<2>;\n}\n"
    )
    assert assembler.ptx_frame_bounds(ptx) == [
        40 + 8 * 13 + 4 + 8 + assembler.FRAME_BOUND_EXTRA,
        8 * 2 + assembler.FRAME_BOUND_EXTRA,
    ]


def test_stack_frames_refuse_what_is_not_a_cubin() -> None:
    assert assembler.stack_frames(b"not an elf image") is None


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_stack_frames_read_from_the_cubin_match_ptxas(tmp_path: Path) -> None:
    """The frames read from the cubin's call frame information are ptxas -v's, and the PTX
    bound of each function is no smaller than the largest of them."""
    from tensorwasm.compiler.frontend import load, translate_module
    from tensorwasm.compiler.pipeline import compile_entries, exported_functions
    from tensorwasm.compiler.target import nvptx_for_device

    wasm = load(EVEN_ODD)
    target = nvptx_for_device((9, 0), 13000)
    ptx = compile_entries(translate_module(wasm), target, exported_functions(wasm)).ptx
    source, cubin = tmp_path / "m.ptx", tmp_path / "m.cubin"
    source.write_text(ptx)
    done = subprocess.run(
        ["ptxas", "-v", "-arch=sm_90", str(source), "-o", str(cubin)],
        capture_output=True,
        text=True,
        check=True,
    )
    import re

    reported = [int(n) for n in re.findall(r"(\d+) bytes stack frame", done.stdout + done.stderr)]
    frames = assembler.stack_frames(cubin.read_bytes())
    assert frames is not None and sorted(frames) == sorted(reported)
    assert max(frames) > 0  # the recursive function saves registers
    assert min(assembler.ptx_frame_bounds(ptx.encode())[:1]) >= max(frames)


# -- the context block carries the limit ---------------------------------------------------


def test_the_context_block_carries_the_depth_limit_and_stack_floor() -> None:
    block = abi.context_block(depth_limit=12_345, stack_floor=0x7000)
    assert block[abi.CTX_DEPTH_LIMIT] == 12_345
    assert block[abi.CTX_STACK_FLOOR] == 0x7000
    assert abi.context_block()[abi.CTX_DEPTH_LIMIT] == 0  # the compiled default


def test_the_host_executor_hands_its_limit_to_the_code() -> None:
    executor = HostExecutor(EVEN_ODD)
    assert executor.ctx[abi.CTX_DEPTH_LIMIT] == HOST_CALL_DEPTH
    executor.ctx[abi.CTX_DEPTH_LIMIT] = 50  # the runtime value decides, not the compilation
    assert executor.call("even", [(I64, 48)]).values == ((I32, 1),)
    assert executor.call("even", [(I64, 60)]).trap == "call stack exhausted"
    assert executor.call("inc", [(I32, 1)]).values == ((I32, 2),)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tells the stack's bounds")
def test_each_thread_has_its_own_native_stack_floor() -> None:
    floors = []
    thread = threading.Thread(target=lambda: floors.append(native_stack_floor()))
    thread.start()
    thread.join()
    assert native_stack_floor() > 0 and floors[0] > 0
    assert native_stack_floor() != floors[0]


# -- the host backend ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "n"), [("even", 10_000), ("odd", 10_001), ("even", 20_001)])
def test_host_deep_mutual_recursion_matches_wasmtime(name: str, n: int) -> None:
    executor = HostExecutor(EVEN_ODD)
    assert executor.call(name, [(I64, n)]).values == expected(EVEN_ODD, name, [(I64, n)]).values


def test_host_endless_recursion_traps_without_crashing() -> None:
    executor = HostExecutor(EVEN_ODD)
    assert expected(EVEN_ODD, "inf", [(I32, 0)]).trap == "call stack exhausted"
    assert executor.call("inf", [(I32, 0)]).trap == "call stack exhausted"
    assert executor.call("inc", [(I32, 41)]).values == ((I32, 42),)


def test_host_large_frames_trap_at_the_stack_floor_before_the_depth_limit() -> None:
    """Frames of a few KiB each: the native stack (8 MiB or so) ends long before a million
    calls; the floor check traps, the process lives on and the instance still works."""
    executor = HostExecutor(big_frames())
    assert executor.call("deep", []).trap == "call stack exhausted"
    assert executor.call("inc", [(I32, 1)]).values == ((I32, 2),)


# -- the GPU (run on the GPU machine) --------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", [200, 201])
def test_gpu_mutual_recursion_of_200(n: int) -> None:
    executor = GPUExecutor(EVEN_ODD)
    for name in ("even", "odd"):
        assert executor.call(name, [(I64, n)]).values == expected(EVEN_ODD, name, [(I64, n)]).values


@pytest.mark.gpu
def test_gpu_mutual_recursion_of_10000_or_a_clean_trap_at_the_planned_depth() -> None:
    """even(10000) needs 10,001 counted calls: it runs where the planned depth allows them
    (the stack the device's memory affords, see docs/semantics.md), and otherwise traps as
    exhaustion; either way the context stays usable."""
    executor = GPUExecutor(EVEN_ODD)
    assert executor.stack.depth_limit >= 2_000
    result = executor.call("even", [(I64, 10_000)])
    if executor.stack.depth_limit > 10_000:
        assert result.values == expected(EVEN_ODD, "even", [(I64, 10_000)]).values
    else:
        assert result.trap == "call stack exhausted"
    deepest = min(executor.stack.depth_limit - 1, 10_000)
    assert (
        executor.call("even", [(I64, deepest)]).values == expected(EVEN_ODD, "even", [(I64, deepest)]).values
    )
    assert executor.call("inc", [(I32, 1)]).values == ((I32, 2),)


@pytest.mark.gpu
def test_gpu_endless_recursion_traps_cleanly_and_the_context_stays_usable() -> None:
    executor = GPUExecutor(EVEN_ODD)
    for _ in range(2):
        assert executor.call("inf", [(I32, 0)]).trap == "call stack exhausted"
        assert executor.call("inc", [(I32, 41)]).values == ((I32, 42),)


@pytest.mark.gpu
def test_gpu_large_frame_recursion_traps_cleanly_and_later_modules_still_run() -> None:
    """The skip-stack-guard-page shape: frames of several KiB recursing without end trap as
    exhaustion before the hardware stack overflows (no CUDA_ERROR_ILLEGAL_ADDRESS), and the
    same executor, and a new module after it, still run."""
    executor = GPUExecutor(big_frames())
    assert 0 < executor.stack.depth_limit
    assert executor.call("deep", []).trap == "call stack exhausted"
    assert executor.call("inc", [(I32, 1)]).values == ((I32, 2),)
    later = GPUExecutor(EVEN_ODD)
    assert later.call("even", [(I64, 200)]).values == ((I32, 1),)
