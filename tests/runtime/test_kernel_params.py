"""A GPU loop kernel's live-ins by value (``compiler.lower.abi.params_by_value``): one
``byval`` parameter of 64-bit words, which the kernel reads from its parameter space (the
constant bank) rather than from device memory; past ``PARAM_WORDS_BY_VALUE`` words, a
pointer to the scratch image's copy. The runtime passes each arrival's own words, a
recorded launch keeps those it was recorded with, and results are wasmtime's either way
(on the simulated device, and on the GPU: marker gpu)."""

from __future__ import annotations

import ctypes
import random
import re
import struct
from pathlib import Path

import pytest

from tensorwasm.compiler.lower import abi
from tests.compiler.test_loop_kernels import assemble, kernels, loop_kernels_ptx
from tests.compiler.test_nest_entry import SWEEP
from tests.runtime.test_offload import _blas1_pair, _saxpy_256


def test_a_gpu_loop_kernel_reads_its_live_ins_from_its_parameters(ptxas: str, tmp_path: Path) -> None:
    """The sweep's live-ins (n, a, b and what clang-like code derives from them) are one
    ``.param .b8`` array of 8-byte words, read by ``ld.param``; its only global load before
    the cells' is the memory base, from the context."""
    ptx = loop_kernels_ptx(SWEEP, "sm_90")
    assemble(ptxas, ptx, "sm_90", tmp_path)
    for name, body in kernels(ptx).items():
        (words,) = re.findall(rf"\.param \.align 8 \.b8 {name}_param_1\[(\d+)\]", body)
        assert int(words) % 8 == 0 and int(words) > 0
        assert re.search(rf"ld\.param\.\w+\s+%\w+, \[{name}_param_1(\+\d+)?\]", body)
        head = body.split("ld.global.b32")[0]  # up to the first load of a cell
        assert head.count("ld.global") == 1, head  # the memory base


def test_past_the_limit_a_kernel_takes_a_pointer(monkeypatch) -> None:
    monkeypatch.setattr(abi, "PARAM_WORDS_BY_VALUE", 0)
    ptx = loop_kernels_ptx(SWEEP, "sm_90")
    for name, body in kernels(ptx).items():
        assert re.search(rf"\.param \.u64 \.ptr .*{name}_param_1\b", body), body[:400]
        assert f"{name}_param_1[" not in body


def test_a_kernel_that_would_read_past_its_words_is_refused(monkeypatch) -> None:
    """The words a kernel takes by value and the live-ins it reads are counted apart (the
    runtime passes one word a live-in): a kernel reading more than it declared would read
    whatever follows in its parameter space, so the lowering refuses it, naming both."""
    from tensorwasm.compiler.errors import CompileError

    monkeypatch.setattr(abi, "param_words", lambda live_ins: 1)
    with pytest.raises(CompileError, match=r"reads [2-9]\d* live-ins from 1 words"):
        loop_kernels_ptx(SWEEP, "sm_90")


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("by_value", [True, False])
def test_each_arrival_runs_with_its_own_live_ins(device: str, by_value: bool, monkeypatch, tmp_path) -> None:
    """saxpy called with ``a`` changing and alternating (each set of live-ins launched, then
    recorded and replayed): each call leaves wasmtime's memory. By value, the launch's
    second argument is the arrival's words; past the limit (the limit set to 0, in a cache of
    its own), a pointer into the scratch buffer."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    if not by_value:
        monkeypatch.setattr(abi, "PARAM_WORDS_BY_VALUE", 0)
    offload, (store, ours), (plain_store, plain) = _blas1_pair(device)
    rng = random.Random(5)
    try:
        for a in (1.5, 1.5, -2.0, 1.5, -2.0, -2.0, 0.25, 1.5):
            data = struct.pack("<512f", *(rng.uniform(-4, 4) for _ in range(512)))
            assert _saxpy_256(store, ours, a, data) == _saxpy_256(plain_store, plain, a, data), a
        loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
        assert loop.stats.offloaded == 8
        (ready,) = offload.planner.guard_cache[loop.kernel_index].values()
        params = ready.device_arguments[-1]
        assert isinstance(params.slots[1], ctypes.Array) is by_value
        if by_value:  # the last arrival's words: a = 1.5 among them, not the 0.25 before
            words = bytes(params.slots[1])
            assert words in {arrival.param_bytes for arrival in ready._arrivals.values()}
            assert struct.pack("<f", 1.5) in words and struct.pack("<f", 0.25) not in words
    finally:
        offload.close()
