"""ptxas assembles PTX in a process of its own before the driver sees it: a crash of NVIDIA's
assembler is an error naming the cause, never the end of the process that hosts the program."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwasm.runtime import assembler
from tensorwasm.runtime.assembler import AssemblerCrash, assemble
from tests.conftest import ROOT
from tests.runtime.test_driver import ADD_ONE_PTX, _fake_context

# A module ptxas 13.0 dies on (a segmentation fault): a recursive function that takes the
# square root of a value it folds from constants, found by the GPU fuzzer (smith).
CRASHING = ROOT / "tests/data/ptxas-crash.ptx"


def _fake_ptxas(tmp_path: Path, body: str) -> str:
    """A ptxas that reports release 13.0 and then runs ``body`` (a shell command)."""
    script = tmp_path / "ptxas"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi\n'
        f"{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_module_is_assembled_to_a_cubin_for_its_target(ptxas: str, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    cubin = assemble(ADD_ONE_PTX.encode() + b"\0", "sm_90", 13000)
    assert cubin is not None and cubin[:4] == b"\x7fELF"


def test_a_ptxas_newer_than_the_driver_or_turned_off_leaves_the_module_to_the_driver(
    ptxas: str, monkeypatch
) -> None:
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    release = assembler.ptxas()[1]
    older = 1000 * (release[0] - 1) + 10 * release[1]  # a driver of the CUDA major before
    assert assemble(ADD_ONE_PTX.encode(), "sm_90", older) is None
    monkeypatch.setenv("TENSORWASM_PTXAS", "off")
    assert assembler.ptxas() is None
    assert assemble(ADD_ONE_PTX.encode(), "sm_90", 13000) is None


def test_a_module_ptxas_refuses_goes_to_the_driver_which_reports_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(
        "TENSORWASM_PTXAS", _fake_ptxas(tmp_path, 'echo "ptxas fatal: bad token" >&2; exit 255')
    )
    assert assemble(ADD_ONE_PTX.encode(), "sm_90", 13000) is None


@pytest.mark.parametrize("crash", ["kill -SEGV $$", "exit 139"], ids=["signal", "through-a-shell"])
def test_a_crashing_ptxas_is_a_load_error_and_the_driver_never_sees_the_module(
    crash: str, tmp_path, monkeypatch
) -> None:
    from cuda.bindings import driver as cu

    from tensorwasm.runtime.driver import ModuleLoadError

    context = _fake_context(monkeypatch)
    loads: list[bytes] = []
    monkeypatch.setattr(cu, "cuModuleLoadDataEx", lambda image, *rest: loads.append(image))
    monkeypatch.setattr(cu, "cuLinkCreate", lambda *rest: loads.append(b"link"))
    monkeypatch.setenv("TENSORWASM_PTXAS", _fake_ptxas(tmp_path, crash))
    for load in (context.load_module, context.link_cubin):
        with pytest.raises(ModuleLoadError) as info:
            load(ADD_ONE_PTX)
        assert info.value.crashed
        message = str(info.value)
        assert "ptxas crashed on the module" in message and "SIGSEGV" in message
        kept = message.rsplit("ptxas -arch=sm_90 ", 1)[1].strip()
        assert Path(kept).read_bytes() == ADD_ONE_PTX.encode()  # kept to reproduce it
        Path(kept).unlink()
    assert not loads


def test_the_module_that_crashes_ptxas_13_is_reported_not_fatal(ptxas: str, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    release = assembler.ptxas()[1]
    try:
        cubin = assemble(CRASHING.read_bytes(), "sm_90", 13000 if release <= (13, 0) else 99000)
    except AssemblerCrash as exc:
        assert "SIGSEGV" in exc.detail
        exc.kept.unlink()
    else:  # a ptxas that no longer crashes assembles it
        assert release != (13, 0) and cubin is not None


_LOAD_CRASHING = """
import sys
from tensorwasm.runtime.driver import Context, ModuleLoadError
try:
    Context.get().load_module(open(sys.argv[1], "rb").read())
    print("loaded")
except ModuleLoadError as exc:
    print("refused", exc.crashed)
"""


@pytest.mark.gpu
def test_on_the_gpu_a_module_that_crashes_the_assembler_leaves_the_process_alive() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_CRASHING, str(CRASHING)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # before: the driver's JIT died of SIGSEGV, and the process
    assert done.stdout.split() in (["refused", "True"], ["loaded"]), done.stdout


def test_the_oracle_counts_a_module_ptxas_crashed_on_as_skipped_not_as_a_mismatch() -> None:
    from tensorwasm.oracle.case import Call, Case
    from tensorwasm.oracle.compare import run_case
    from tensorwasm.runtime.driver import ModuleLoadError

    def crashing(wasm: bytes):
        raise ModuleLoadError(
            "ptxas", 218, "ptxas 13.0 crashed (SIGSEGV) on the module", "sm_90", "/tmp/m.ptx"
        )

    case = Case("control", '(module (func (export "f") (result i32) i32.const 1))', [Call("f", ())])
    outcome = run_case(case, crashing)
    assert not outcome.failed and outcome.skipped == 1
    assert any("ptxas crashed" in note for note in outcome.notes)


def test_an_interrupted_ptxas_did_not_crash(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_PTXAS", _fake_ptxas(tmp_path, "kill -TERM $$"))
    assert assemble(ADD_ONE_PTX.encode(), "sm_90", 13000) is None  # the driver's JIT takes it


def test_the_cubin_cache_names_the_assembler_and_keeps_what_the_driver_accepts(
    ptxas: str, tmp_path, monkeypatch
) -> None:
    from tensorwasm.runtime.cache import Cache, kernels_cubin_key, load_kernels
    from tensorwasm.runtime.driver import Context, CudaError

    context = _fake_context(monkeypatch)
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    with_ptxas = kernels_cubin_key(context, ADD_ONE_PTX.encode())
    monkeypatch.setenv("TENSORWASM_PTXAS", "off")
    assert kernels_cubin_key(context, ADD_ONE_PTX.encode()) != with_ptxas
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    links: list[bool] = []

    def link(self, ptx, assemble: bool = True) -> bytes:
        links.append(assemble)
        return b"ptxas's" if assemble else b"the driver's"

    def load(self, cubin: bytes, entries):
        if cubin == b"ptxas's":  # a cubin this driver refuses
            raise CudaError("cuModuleLoadData", 200)  # CUDA_ERROR_INVALID_IMAGE
        return cubin

    monkeypatch.setattr(Context, "link_cubin", link)
    monkeypatch.setattr(Context, "load_cubin", load)
    assert load_kernels(context, ADD_ONE_PTX.encode(), Cache(tmp_path)) == b"the driver's"
    assert links == [True, False]
    assert load_kernels(context, ADD_ONE_PTX.encode(), Cache(tmp_path)) == b"the driver's"
    assert links == [True, False]  # the second load found the driver's cubin in the cache
