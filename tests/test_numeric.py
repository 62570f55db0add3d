"""Every scalar numeric op against wasmtime on edge values, on the host backend (and the GPU)."""

from __future__ import annotations

import pytest
from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget
from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceInstance

from tests.conftest import wat
from tests.numeric_cases import cases, export_name, numeric_module_wat, numeric_ops, same_result

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
            if not same_result(op, expected, actual):
                failures.append(f"{op.name}{[hex(v) for _, v in args]}: wasmtime {expected}, got {actual}")
    return failures


def test_every_numeric_op_is_covered() -> None:
    assert len(OPS) >= 120  # i32/i64/f32/f64 arithmetic, comparisons and conversions


def test_host_backend_matches_wasmtime(module_bytes, reference) -> None:
    failures = check_backend(HostExecutor(module_bytes), reference)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, "sm_75", "sm_80"], ids=["device", "sm_75", "sm_80"])
def test_gpu_matches_wasmtime(module_bytes, reference, arch: str | None) -> None:
    # PTX for older architectures runs on newer GPUs too: sm_75 exercises the emulated
    # NaN-propagating min/max, sm_80 the min.NaN instructions.
    target = NVPTXTarget(arch, ARCH_PTX[arch]) if arch else None
    failures = check_backend(GPUExecutor(module_bytes, target=target), reference)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])
