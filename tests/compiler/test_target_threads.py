"""Kernels compile on several threads at once: each thread parses into an LLVM context of
its own and emits with target machines of its own, and the code is the same as one
thread's; the NVPTX pipeline leaves out the loop vectorizer, which changes no kernel."""

from __future__ import annotations

import re
import threading

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.prepare import compile_loop_kernels, prepare_offload
from tensorwasm.compiler.target import HostTarget, NVPTXTarget, thread_context
from tests.offload_cases import module_bytes


def _ptx(text: str) -> str:
    """PTX without the call-site counters a target machine numbers on from module to module."""
    return re.sub(r"callseq \d+", "callseq", text)


@pytest.fixture(scope="module")
def blas1():
    return prepare_offload(module_bytes("blas1", "O2"))


def test_threads_have_their_own_context_and_machines() -> None:
    target = NVPTXTarget()
    seen = {}

    def look(name: str) -> None:
        seen[name] = (thread_context(), target.target_machine(), HostTarget().target_machine())

    threads = [threading.Thread(target=look, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    look("main")
    assert len({id(v[0]) for v in seen.values()}) == 3
    assert len({id(v[1]) for v in seen.values()}) == 3
    assert len({id(v[2]) for v in seen.values()}) == 3
    assert thread_context() is seen["main"][0] and target.target_machine() is seen["main"][1]


@pytest.mark.parametrize("target", [NVPTXTarget(), HostTarget()], ids=["sm_90", "host"])
def test_kernels_compiled_on_threads_at_once_are_those_of_one_thread(blas1, target) -> None:
    indices = [k.index for k in blas1.state.kernels.loops][:4]
    assert len(indices) == 4

    def code(index: int) -> str | bytes:
        compiled = compile_loop_kernels(blas1, target, [index])
        return _ptx(compiled.text) if target.is_gpu else compiled.obj

    alone = {index: code(index) for index in indices}
    together: dict[int, str | bytes] = {}
    start = threading.Barrier(len(indices))

    def compile_one(index: int) -> None:
        start.wait()
        together[index] = code(index)

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_the_nvptx_pipeline_without_the_loop_vectorizer_writes_the_same_ptx(blas1, monkeypatch) -> None:
    target = NVPTXTarget()
    assert NVPTXTarget.loop_vectorization is False and HostTarget.loop_vectorization is True
    state = pipeline.run(pipeline.Request(module_bytes("blas1", "O2.simd"), entries=pipeline.LOOPS,
                                          target=target), "llvm")  # fmt: skip
    sized = _ptx(target.emit_ptx(state.llvm.text))
    monkeypatch.setattr(NVPTXTarget, "loop_vectorization", True)
    assert _ptx(target.emit_ptx(state.llvm.text)) == sized
