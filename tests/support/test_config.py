"""tensorwasm.support.config: each environment variable read, parsed and checked in one
place, a bad value refused with an error naming the variable and the value; the product
reads the environment nowhere else."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwasm.runtime.cli import main
from tensorwasm.support import config
from tensorwasm.support.errors import ConfigError, TensorWasmError
from tests.conftest import ROOT


@pytest.fixture
def bare(monkeypatch) -> pytest.MonkeyPatch:
    """An environment without any of the variables read here."""
    for name in (
        config.CACHE_DIR, config.CACHE, config.DEVICE_MEMORY_LIMIT, config.PTXAS, "XDG_CACHE_HOME",
        *config.CUDA_SELECTION, config.LIBRARY_PATH, config.COMPILE, config.COMPILE_THREADS,
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unset_and_empty_variables_mean_the_defaults(bare, tmp_path) -> None:
    bare.setenv("HOME", str(tmp_path))
    assert config.cache_dir() == tmp_path / ".cache" / "tensorwasm"
    assert config.cache_enabled() is True
    assert config.device_memory_limit() is None
    assert config.ptxas() is None
    for name in (config.CACHE_DIR, config.CACHE, config.DEVICE_MEMORY_LIMIT, config.PTXAS):
        bare.setenv(name, "")
    assert config.cache_dir() == tmp_path / ".cache" / "tensorwasm"
    assert (config.cache_enabled(), config.device_memory_limit(), config.ptxas()) == (True, None, None)


def test_the_cache_directory(bare, tmp_path) -> None:
    bare.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.cache_dir() == tmp_path / "xdg" / "tensorwasm"
    bare.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "mine"))
    assert config.cache_dir() == tmp_path / "mine"  # (need not exist yet)
    (tmp_path / "file").write_text("")
    bare.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(ConfigError, match=r"^TENSORWASM_CACHE_DIR='.*/file' is not a directory$"):
        config.cache_dir()


def test_the_cache_is_on_or_off(bare) -> None:
    for text, enabled in (("on", True), ("off", False), ("OFF", False), (" On ", True)):
        bare.setenv("TENSORWASM_CACHE", text)
        assert config.cache_enabled() is enabled
    bare.setenv("TENSORWASM_CACHE", "0")
    with pytest.raises(ConfigError, match=r"^TENSORWASM_CACHE='0': say on or off$"):
        config.cache_enabled()


def test_when_kernels_compile(bare) -> None:
    assert config.compile_mode() == "auto"
    for text, mode in (("sync", "sync"), (" Background ", "background"), ("auto", "auto")):
        bare.setenv("TENSORWASM_COMPILE", text)
        assert config.compile_mode() == mode
    bare.setenv("TENSORWASM_COMPILE", "later")
    with pytest.raises(ConfigError, match=r"^TENSORWASM_COMPILE='later': say auto, background or sync$"):
        config.compile_mode()


def test_the_compile_threads_are_a_count(bare) -> None:
    assert 1 <= config.compile_threads() <= 2
    bare.setenv("TENSORWASM_COMPILE_THREADS", "4")
    assert config.compile_threads() == 4
    for text in ("0", "many", "65"):
        bare.setenv("TENSORWASM_COMPILE_THREADS", text)
        with pytest.raises(ConfigError, match=rf"^TENSORWASM_COMPILE_THREADS='{text}': say a count"):
            config.compile_threads()


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1 << 20), ("512M", 512 << 20), ("2g", 2 << 30), (" 64 KiB ", 64 << 10), ("3GB", 3 << 30)],
)
def test_the_device_memory_limit_is_a_size(bare, text: str, size: int) -> None:
    bare.setenv("TENSORWASM_DEVICE_MEMORY_LIMIT", text)
    assert config.device_memory_limit() == size


@pytest.mark.parametrize("text", ["lots", "1.5G", "-1", "2T", "M"])
def test_a_device_memory_limit_that_is_no_size_is_refused(bare, text: str) -> None:
    bare.setenv("TENSORWASM_DEVICE_MEMORY_LIMIT", text)
    with pytest.raises(ConfigError, match=rf"^TENSORWASM_DEVICE_MEMORY_LIMIT={text!r} is not a size"):
        config.device_memory_limit()


def test_ptxas_is_an_executable_or_off(bare, tmp_path: Path) -> None:
    tool = tmp_path / "ptxas"
    tool.write_text("#!/bin/sh\n")
    bare.setenv("TENSORWASM_PTXAS", str(tool))
    with pytest.raises(ConfigError, match=r"^TENSORWASM_PTXAS='.*/ptxas' names no executable file"):
        config.ptxas()  # (not executable)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    assert config.ptxas() == str(tool)
    bare.setenv("TENSORWASM_PTXAS", "off")
    assert config.ptxas() is False
    bare.setenv("TENSORWASM_PTXAS", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"names no executable file \(a ptxas, or off\)"):
        config.ptxas()


def test_cudas_own_variables_are_read_as_they_are(bare) -> None:
    assert config.cuda_selection() == (None, None) and config.library_path() is None
    bare.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every GPU: not the same as unset
    bare.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    bare.setenv("LD_LIBRARY_PATH", "/opt/cuda/lib64")
    assert config.cuda_selection() == ("", "PCI_BUS_ID") and config.library_path() == "/opt/cuda/lib64"


def test_a_config_error_is_the_projects_error() -> None:
    assert issubclass(ConfigError, TensorWasmError)  # the CLI says it in one line


def test_the_readers_go_through_it(bare, tmp_path) -> None:
    from tensorwasm.runtime import assembler, limits
    from tensorwasm.runtime.cache import default_cache

    bare.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    bare.setenv("TENSORWASM_CACHE", "off")
    assert default_cache().enabled is False and default_cache().directory == tmp_path / "cache"
    bare.setenv("TENSORWASM_CACHE", "sometimes")
    with pytest.raises(ConfigError, match="TENSORWASM_CACHE='sometimes'"):
        default_cache()
    bare.setenv("TENSORWASM_DEVICE_MEMORY_LIMIT", "1G")
    assert limits.default_limit() == 1 << 30
    bare.setenv("TENSORWASM_DEVICE_MEMORY_LIMIT", "a lot")
    with pytest.raises(ConfigError, match="TENSORWASM_DEVICE_MEMORY_LIMIT='a lot'"):
        limits.default_limit()
    bare.setenv("TENSORWASM_PTXAS", "off")
    assert assembler.ptxas() is None
    bare.setenv("TENSORWASM_PTXAS", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="TENSORWASM_PTXAS="):
        assembler.ptxas()


def test_the_command_says_a_bad_value_in_one_line(bare, capsys) -> None:
    bare.setenv("TENSORWASM_CACHE", "maybe")
    assert main(["cache", "info"]) == 2
    assert capsys.readouterr().err == "tensorwasm: error: TENSORWASM_CACHE='maybe': say on or off\n"


def test_importing_it_loads_nothing_else_of_tensorwasm() -> None:
    code = "import sys, tensorwasm.support.config; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorwasm')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.split() == ["tensorwasm", "tensorwasm.support", "tensorwasm.support.config",
                                   "tensorwasm.support.errors"]  # fmt: skip


# Product files that read the environment for something other than configuration: the
# GPU process is started with this process's environment (and its import path).
PASSES_THE_ENVIRONMENT_ON = {"runtime/remote.py"}


def test_the_product_reads_the_environment_only_here() -> None:
    """No product file but config.py names ``os.environ`` or ``os.getenv``, nor a
    ``TENSORWASM_`` variable outside its documentation."""
    found = []
    for folder in ("tensorwasm", "dialect", "compiler", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == "tensorwasm/support/config.py":
                continue
            tree = ast.parse(path.read_text())
            docs = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                    if name not in PASSES_THE_ENVIRONMENT_ON:
                        found.append(f"{name}:{node.lineno}: os.{node.attr}")
                elif (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and "TENSORWASM_" in node.value
                    and id(node) not in docs
                ):
                    found.append(f"{name}:{node.lineno}: {node.value!r}")
    assert not found, "read the environment through tensorwasm.support.config:\n" + "\n".join(found)
