"""Every scalar numeric op against wasmtime on edge values, on the host backend (and the GPU)."""

from __future__ import annotations

import pytest

from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget
from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat
from tests.numeric_cases import (
    EDGES,
    cases,
    export_name,
    foldable_exports,
    foldable_module_wat,
    numeric_module_wat,
    numeric_ops,
    same_result,
)

OPS = numeric_ops()


@pytest.fixture(scope="module")
def module_bytes() -> bytes:
    return wat(numeric_module_wat())


@pytest.fixture(scope="module")
def reference(module_bytes):
    return ReferenceInstance(module_bytes)


def check_backend(backend, reference) -> list[str]:
    failures = []
    for op in OPS:
        name = export_name(op)
        for args in cases(op):
            expected = reference.call(name, args)
            actual = backend.call(name, args)
            if not same_result(op.name, expected, actual):
                failures.append(f"{op.name}{[hex(v) for _, v in args]}: wasmtime {expected}, got {actual}")
    return failures


def check_foldable(backend, reference) -> list[str]:
    failures = []
    for name, ty in foldable_exports():
        for bits in EDGES[ty]:
            expected = reference.call(name, [(ty, bits)])
            actual = backend.call(name, [(ty, bits)])
            if not same_result(name, expected, actual):
                failures.append(f"{name}({bits:#x}): wasmtime {expected}, got {actual}")
    return failures


@pytest.fixture(scope="module")
def foldable_bytes() -> bytes:
    return wat(foldable_module_wat())


def test_every_numeric_op_is_covered() -> None:
    assert len(OPS) >= 120  # i32/i64/f32/f64 arithmetic, comparisons and conversions


def test_host_backend_matches_wasmtime(module_bytes, reference) -> None:
    failures = check_backend(HostExecutor(module_bytes), reference)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


def test_host_backend_quiets_nans_of_foldable_expressions(foldable_bytes) -> None:
    # x * 1, x - 0, x / 1, -1 * x... of a signalling NaN: an arithmetic NaN, never the operand.
    failures = check_foldable(HostExecutor(foldable_bytes), ReferenceInstance(foldable_bytes))
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, "sm_75", "sm_80"], ids=["device", "sm_75", "sm_80"])
def test_gpu_quiets_nans_of_foldable_expressions(foldable_bytes, arch: str | None) -> None:
    target = NVPTXTarget(arch, ARCH_PTX[arch]) if arch else None
    failures = check_foldable(GPUExecutor(foldable_bytes, target=target), ReferenceInstance(foldable_bytes))
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, "sm_75", "sm_80"], ids=["device", "sm_75", "sm_80"])
def test_gpu_matches_wasmtime(module_bytes, reference, arch: str | None) -> None:
    # PTX for older architectures runs on newer GPUs too: sm_75 exercises the emulated
    # NaN-propagating min/max, sm_80 the min.NaN instructions.
    target = NVPTXTarget(arch, ARCH_PTX[arch]) if arch else None
    failures = check_backend(GPUExecutor(module_bytes, target=target), reference)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.parametrize(
    ("wasmtime", "ours", "allowed"),
    [
        (0xFFC00000, 0x7FC00000, True),  # canonical for canonical, either sign
        (0xFFC00000, 0x7FFFFFFF, False),  # PTX's f32 NaN is not canonical
        (0x7FE00000, 0x7FC00000, True),  # arithmetic for arithmetic
        (0x7FE00000, 0x7FA00000, False),  # a signalling NaN is never arithmetic
        (0x7FA00000, 0x7FE00000, False),  # wasmtime's signalling NaN came from a bit operation
        (0x3F800000, 0x7FC00000, False),
    ],
)
def test_nan_results_are_judged_by_wasm_rules(wasmtime: int, ours: int, allowed: bool) -> None:
    from tensorwasm.dialect.types import F32
    from tensorwasm.oracle.compare import same_value

    assert same_value((F32, wasmtime), (F32, ours), exact=False) is allowed
    assert same_value((F32, wasmtime), (F32, ours), exact=True) is False
