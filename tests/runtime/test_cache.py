"""The compiled-code cache: hits skip compilation, entries are checked, corruption is rebuilt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorwasm.dialect.types import I32
from tensorwasm.runtime.cache import Cache, default_cache
from tensorwasm.runtime.cli import main
from tensorwasm.runtime.executor import HostExecutor
from tests.conftest import wat

MODULE = '(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul))'


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_second_instance_hits_and_runs_the_same(cache_dir: Path) -> None:
    first = HostExecutor(wat(MODULE))
    assert not first.compilation.cached
    second = HostExecutor(wat(MODULE))
    assert second.compilation.cached and second.compilation.llvm_ir == ""
    assert second.call("sq", [(I32, 12)]).values == ((I32, 144),)
    assert [p.suffix for p in (cache_dir / "obj").iterdir()] == [".bin"]


def test_corrupted_entry_is_dropped_and_rebuilt(cache_dir: Path) -> None:
    HostExecutor(wat(MODULE))
    (entry,) = (cache_dir / "obj").iterdir()
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated
    default_cache().memory.clear()  # as a new process would start
    again = HostExecutor(wat(MODULE))
    assert not again.compilation.cached
    assert again.call("sq", [(I32, 3)]).values == ((I32, 9),)
    assert Cache(cache_dir).get("obj", entry.stem) is not None  # rewritten whole


def test_entries_are_written_atomically(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    cache.put("ptx", "k", b"payload")
    assert Cache(cache_dir).get("ptx", "k") == b"payload"
    assert not [p for p in (cache_dir / "ptx").iterdir() if p.name.startswith(".tmp")]


def test_an_entry_is_written_where_another_writer_makes_its_folder_first(cache_dir: Path, monkeypatch) -> None:
    """Two compiles that finish together both find the entry's folder missing; the one
    whose ``mkdir`` comes second still writes its entry (it warned and wrote nothing)."""
    import tensorwasm.runtime.cache as cache_module

    real_mkdir = os.mkdir

    def mkdir_after_another_writer(path, mode=0o777):
        real_mkdir(path, mode)  # the other writer's
        real_mkdir(path, mode)  # ours: FileExistsError

    cache = Cache(cache_dir)
    cache.put("ptx", "first", b"one")  # the directory and its key exist
    monkeypatch.setattr(cache_module.os, "mkdir", mkdir_after_another_writer)
    assert cache.write_file(Path("obj") / "entry.bin", b"payload")
    monkeypatch.undo()
    assert (cache_dir / "obj" / "entry.bin").read_bytes() == b"payload"


def test_cache_info_and_clear(cache_dir: Path, capsys) -> None:
    HostExecutor(wat(MODULE))
    HostExecutor(wat(MODULE))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "1 hits, 1 misses" in out and "obj: 1 entries" in out
    kept = cache_dir / "fingerprints" / ("0" * 64)  # the compiler's, under its sources' listing
    kept.parent.mkdir(exist_ok=True)
    kept.write_text("f" * 64)
    assert main(["cache", "info"]) == 0
    assert "fingerprints: 1 entries, 64 bytes" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("removed ")
        and f"from {cache_dir}: " in out
        and "obj 1" in out
        and "fingerprints" in out
    )
    assert not cache_dir.exists()


def test_warm_offload_start_skips_the_compiler_and_runs_the_same(cache_dir: Path, monkeypatch) -> None:
    import tensorwasm.compiler.frontend.translate as translate
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import SPECS, Case, module_bytes, run_case

    wasm = module_bytes("stencil", "O2")
    cold = OffloadModule(wasm, device="cpu")
    spec = SPECS["stencil"]["jacobi2d"]
    case = Case({"m": 19, "n": 23, "k": 1}, [0.0] * len(spec), [0, 4], seed=2)
    assert run_case(cold.rewritten, "jacobi2d", spec, case, cold) == run_case(wasm, "jacobi2d", spec, case)
    assert cold.kernels.counts.compiled == 1 and not cold.cached  # compiled at its first launch
    default_cache().memory.clear()  # as a new process would start

    def refuse(*args):
        raise AssertionError("a warm start must not translate the module")

    monkeypatch.setattr(translate, "translate_module", refuse)
    warm = OffloadModule(wasm, device="cpu")
    assert warm._wasm is None  # not even decoded
    assert not warm.kernels and not warm.kernels.units  # its code is read at the first launch
    assert [lp.stats.offset for lp in warm.loops] == [lp.stats.offset for lp in cold.loops]
    assert [(r.func.name, r.loop.offset, r.verdict, r.reason) for r in warm.reports] == [
        (r.func.name, r.loop.offset, r.verdict, r.reason) for r in cold.reports
    ]
    assert run_case(warm.rewritten, "jacobi2d", spec, case, warm) == run_case(wasm, "jacobi2d", spec, case)
    assert sum(lp.stats.offloaded for lp in warm.loops) == 1
    assert warm.kernels.counts.cached == 1 and warm.cached  # read, not compiled


def test_unreadable_prepared_entry_is_prepared_again(cache_dir: Path) -> None:
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    wasm = module_bytes("blas1", "O2")
    OffloadModule(wasm, device="cpu")
    for entry in (cache_dir / "prepared").iterdir():
        Cache(cache_dir).put("prepared", entry.stem, b"not a pickle")
    default_cache().memory.clear()
    again = OffloadModule(wasm, device="cpu")
    assert again.loops and again._wasm is not None  # prepared from scratch


def test_the_rewritten_module_compiled_by_wasmtime_is_cached_and_refused_code_recompiled(
    cache_dir: Path, monkeypatch
) -> None:
    import wasmtime

    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    prepared = OffloadModule(module_bytes("blas1", "O2"), device="cpu")
    engine = wasmtime.Engine()
    first = prepared.compiled(engine)
    (entry,) = (cache_dir / "cwasm").iterdir()
    default_cache().memory.clear()

    def refuse(*args):
        raise AssertionError("a cached module must not be compiled again")

    with monkeypatch.context() as patch:
        patch.setattr(wasmtime.Module, "__init__", refuse)
        again = prepared.compiled(engine)  # deserialized
    assert [e.name for e in again.exports] == [e.name for e in first.exports]
    Cache(cache_dir).put("cwasm", entry.stem, b"\0asm not wasmtime's code")  # intact, but refused
    default_cache().memory.clear()
    rebuilt = prepared.compiled(engine)
    assert [e.name for e in rebuilt.exports] == [e.name for e in first.exports]
    assert Cache(cache_dir).get("cwasm", entry.stem) == rebuilt.serialize()


def test_tensorwasm_run_does_not_import_the_fuzzer() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = "import sys; from tensorwasm.runtime.cli import build_parser; build_parser(); print('hypothesis' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


# What a warm run of a program whose loops all stay on the CPU never needs: LLVM, the
# CUDA bindings, the decoder and translation, the lowering, the wasi:cuda layer.
NOT_NEEDED_WARM = (
    "llvmlite.binding",
    "cuda.bindings.driver",
    "tensorwasm.compiler.frontend.decoder",
    "tensorwasm.compiler.frontend.translate",
    "tensorwasm.compiler.lower.function",
    "tensorwasm.runtime.wasi_cuda",
)

_WARM_RUN = """
import sys
from tensorwasm.runtime.run import run
status, prepared, _ = run(open(sys.argv[1], "rb").read(), [sys.argv[1], sys.argv[2]], device="cpu")
assert sum(lp.stats.arrivals for lp in prepared.loops) > 0
assert sum(lp.stats.offloaded for lp in prepared.loops) == 0
print(status, [name for name in sys.argv[3:] if name in sys.modules], file=sys.stderr)
"""


def test_a_warm_run_whose_loops_decline_loads_neither_llvm_nor_cuda(cache_dir: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.runtime.test_run import plain_wasmtime

    path = ROOT / "examples/wasi/build/histogram.O2.wasm"
    env = dict(os.environ, TENSORWASM_CACHE_DIR=str(cache_dir))
    command = [sys.executable, "-c", _WARM_RUN, str(path), "3000", *NOT_NEEDED_WARM]
    cold = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    assert "tensorwasm.compiler.frontend.translate" in cold.stderr  # it prepared the module
    assert "llvmlite.binding" not in cold.stderr  # and, its loops declining, compiled no kernel
    warm = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    assert warm.stderr.splitlines()[-1] == "0 []"
    assert warm.stdout == plain_wasmtime(path, ["3000"], tmp_path)[1]
    assert list((cache_dir / "calibration").iterdir())  # measured once, by the cold run


def test_the_host_is_described_by_its_processors_not_their_clocks() -> None:
    from tensorwasm.compiler.target import cpuinfo_signature

    block = "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\ncpu MHz\t\t: {mhz}\nflags\t\t: fpu {extra}\n"
    one = cpuinfo_signature(block.format(n=0, mhz="2100.000", extra="avx2"))
    same_kind = (
        block.format(n=0, mhz="2100.000", extra="avx2") + "\n" + block.format(n=1, mhz="800.0", extra="avx2")
    )
    assert cpuinfo_signature(same_kind) == one  # another core of the same kind, another clock
    assert one != cpuinfo_signature(block.format(n=0, mhz="2100.000", extra="avx2 avx512f"))
    two_kinds = (
        block.format(n=0, mhz="2100.000", extra="avx2") + "\n" + block.format(n=1, mhz="1.0", extra="")
    )
    assert cpuinfo_signature(two_kinds) not in (one, None)  # every kind of core counts
    assert cpuinfo_signature("") is None  # LLVM is asked instead


def test_the_calibration_is_measured_by_the_first_processes_and_the_fastest_kept(
    cache_dir: Path, monkeypatch
) -> None:
    import tensorwasm.runtime.profit as profit

    measured = iter([3e-10, 2e-10, 4e-10])  # the second process ran on a quiet machine
    monkeypatch.setattr(profit, "_measure_seconds_per_op", lambda ops: next(measured))
    seen = []
    try:
        for _ in range(profit.CALIBRATIONS_KEPT + 2):  # as new processes would start
            profit.cpu_seconds_per_op.cache_clear()
            default_cache().memory.clear()
            seen.append(profit.cpu_seconds_per_op())
    finally:
        profit.cpu_seconds_per_op.cache_clear()
    assert seen == [3e-10, 2e-10, 2e-10, 2e-10, 2e-10]  # then no process measures again


def test_the_compiler_fingerprint_is_kept_by_the_sources_listing_and_read_again_when_it_changes(
    cache_dir: Path,
) -> None:
    from tensorwasm.runtime import cache

    cache.compiler_fingerprint.cache_clear()
    first = cache.compiler_fingerprint()
    (kept,) = (cache_dir / "fingerprints").iterdir()
    assert kept.read_text() == first
    kept.write_text("f" * 64)  # what a start finds there is taken without reading the sources
    cache.compiler_fingerprint.cache_clear()
    assert cache.compiler_fingerprint() == "f" * 64
    kept.unlink()  # as after a source changed: another listing, nothing kept for it
    cache.compiler_fingerprint.cache_clear()
    assert cache.compiler_fingerprint() == first
    cache.compiler_fingerprint.cache_clear()


def test_clearing_removes_the_host_kernels_libraries_and_one_a_dead_process_left_on_its_way(cache_dir: Path) -> None:
    from tensorwasm.runtime.cache import TEMPORARY

    cache = default_cache()
    cache.put("so", "a" * 64, b"a library")
    cache.put("host-kernels", "b" * 64, b"{}")
    (cache_dir / "lib").mkdir(mode=0o700)
    (cache_dir / "lib" / f"{TEMPORARY}kernel-1-0-00.so").write_bytes(b"left by a process that died")
    cleared = cache.clear()
    assert not cleared.left and (not cache_dir.exists() or not any(cache_dir.iterdir()))
