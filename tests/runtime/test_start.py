"""A warm start of ``tensorwasm run`` whose loops all stay on the CPU imports only what it
runs: the cached preparation, wasmtime's cached code and the runtime's host functions. Not
the compiler (decoder, translator, analysis, outliner, lowering), nor LLVM, nor the guards,
nor the GPU's layers; on a remembered GPU, neither the driver layer nor the CUDA bindings. Each check runs
a fresh process on a warm cache and reads its ``sys.modules`` once the run is done, before
its report (asked for, to be checked) is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.runtime.test_run import plain_wasmtime

PROGRAM = ROOT / "examples/wasi/build/histogram.O2.wasm"  # every loop declines
ARGS = ["3000"]

# What no warm run whose loops stay on the CPU imports, on either device.
NEVER = (
    "tensorwasm.compiler.analysis.loops",
    "tensorwasm.compiler.analysis.regions",
    "tensorwasm.compiler.callgraph",
    "tensorwasm.compiler.frontend.decoder",
    "tensorwasm.compiler.frontend.module",
    "tensorwasm.compiler.frontend.opcodes",
    "tensorwasm.compiler.frontend.translate",
    "tensorwasm.compiler.lower.function",
    "tensorwasm.compiler.outline",
    "tensorwasm.compiler.traps",
    "tensorwasm.dialect.arith",
    "tensorwasm.dialect.ir",
    "tensorwasm.dialect.opdef",
    "tensorwasm.dialect.verifier",
    "tensorwasm.runtime.guards",
    "tensorwasm.runtime.mirror",
    "concurrent.futures",
    "llvmlite.binding",
    "llvmlite.ir",
    "cuda",
    "numpy",
    "tensorwasm.oracle",  # the fuzzer's command line: a run parses its own alone
    "dataclasses",  # with inspect, ~4.5 ms: the declarations a start loads are records
    "inspect",
    "hashlib",  # loads OpenSSL (~3 ms): cache keys are hashed by tensorwasm.support.digest
    "_hashlib",
    "logging",  # with traceback and tokenize, ~2.5 ms: loggers are tensorwasm.support.logs's until a message
    "traceback",
    "argparse",  # a plain run's command line is read by cli.parse_run
    "pickle",  # ~1.8 ms: the cached preparation is typed records (runtime.prepared)
)
# Nor, on the host backend, the runtime's GPU layers.
NEVER_ON_THE_CPU = ("tensorwasm.runtime.driver", "tensorwasm.runtime.limits", "tensorwasm.runtime.known_gpu")

# ``tensorwasm run`` with the arguments after the first, which names the directory of a
# GPU as the operating system would describe it (empty: the machine's own); once the run
# is done, the modules imported before the report was made go to stderr, on its last line.
_RUN = """
import sys
from pathlib import Path

if sys.argv[1]:
    from tensorwasm.runtime import known_gpu

    root = Path(sys.argv[1])
    known_gpu.PROC, known_gpu.SYS_MODULE, known_gpu.PCI = root / "proc", root / "absent", root / "pci"
    known_gpu.DEV, known_gpu.WSL_LIBRARIES, known_gpu.LINKER_CACHE = root / "dev", root / "wsl", root / "ld.so.cache"
from tensorwasm.runtime import cli, run

imported = set()
make_report = run.report


def report(*args):
    imported.update(sys.modules)
    return make_report(*args)


run.report = report
status = cli.main(sys.argv[2:])
print(" ".join(sorted(imported)), file=sys.stderr)
sys.exit(status)
"""


def _run(device: str, cache: Path, system: Path | None = None) -> tuple[dict, set[str]]:
    """A fresh process's run of the program: its report, and the modules it imported."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # (in the GPU's fingerprint)
    env["TENSORWASM_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(system or ""), "run", str(PROGRAM), *ARGS, "--device", device,
         "--report", "json"],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain_wasmtime(PROGRAM, ARGS, cache.parent)[1]
    *_, report, modules = done.stderr.strip().splitlines()
    return json.loads(report), set(modules.split())


def _imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` imported (a package counts with any of its submodules)."""
    return [name for name in names if any(m == name or m.startswith(name + ".") for m in modules)]


def _declined_everywhere(report: dict, device: str) -> None:
    assert report["device"] == device
    assert not sum(row.get("offloaded") or 0 for row in report["loops"])
    assert any(row["arrivals"] for row in report["loops"] if row["device"])  # it did arrive at loops


def test_a_warm_run_on_the_host_backend_imports_neither_the_compiler_nor_the_gpus_layers(tmp_path) -> None:
    cache = tmp_path / "cache"
    _, cold = _run("cpu", cache)
    assert "tensorwasm.compiler.analysis.loops" in cold  # (the check below can fail)
    report, warm = _run("cpu", cache)
    _declined_everywhere(report, "cpu")
    assert _imported(warm, NEVER + NEVER_ON_THE_CPU) == []


def test_a_warm_auto_run_on_a_remembered_gpu_imports_neither_cuda_nor_llvm(tmp_path, monkeypatch) -> None:
    """The module prepared for the remembered GPU as its first run there left it (faked
    here, so that no GPU is needed): then ``auto`` takes the GPU without a context, and a
    run whose loops all decline never makes one."""
    import tensorwasm.runtime.cuda_device as cuda_device
    import tensorwasm.runtime.offload as offload_module
    from tensorwasm.compiler.analysis.plan import AnalysisOptions
    from tensorwasm.runtime import driver, known_gpu
    from tests.runtime.test_known_gpu import H100, FakeCode, FakeContext, _fake_system

    cache = tmp_path / "cache"
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(cache))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_system(tmp_path)
    for name, path in (("PROC", "proc"), ("SYS_MODULE", "absent"), ("PCI", "pci")):
        monkeypatch.setattr(known_gpu, name, tmp_path / path)
    monkeypatch.setattr(driver.Context, "get", staticmethod(lambda ordinal=0: FakeContext(H100)))
    monkeypatch.setattr(driver.Context, "made", staticmethod(lambda ordinal=0: None))
    monkeypatch.setattr(cuda_device, "load_kernels", lambda context, ptx: FakeCode(ptx))
    known_gpu.remember(H100)
    offload_module.OffloadModule(PROGRAM.read_bytes(), device="gpu", mode="auto", options=AnalysisOptions())
    known_gpu.remember_launches(PROGRAM.read_bytes(), False)

    _run("auto", cache, tmp_path)  # wasmtime's code and the calibration: cached by a first run
    report, warm = _run("auto", cache, tmp_path)
    _declined_everywhere(report, "gpu")
    assert _imported(warm, (*NEVER, "tensorwasm.runtime.driver")) == []


def test_a_warm_auto_run_where_no_gpu_was_found_loads_no_cuda(tmp_path, monkeypatch) -> None:
    """Where the driver found no GPU last time and the system shows none (faked here:
    an empty system), ``auto`` takes the host backend without loading CUDA to ask again."""
    from tensorwasm.runtime import known_gpu

    cache = tmp_path / "cache"
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(cache))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name, path in (("PROC", "proc"), ("SYS_MODULE", "absent"), ("PCI", "pci"), ("DEV", "dev"),
                       ("WSL_LIBRARIES", "wsl"), ("LINKER_CACHE", "ld.so.cache")):  # fmt: skip
        monkeypatch.setattr(known_gpu, name, tmp_path / path)
    known_gpu.remember_absence("no usable GPU: the driver reports zero devices")

    _run("auto", cache, tmp_path)
    report, warm = _run("auto", cache, tmp_path)
    _declined_everywhere(report, "cpu")
    assert _imported(warm, (*NEVER, "tensorwasm.runtime.driver", "tensorwasm.runtime.limits")) == []
