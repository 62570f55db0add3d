"""The compiled-code cache: hits skip compilation, entries are checked, corruption is rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest

from dialect.types import I32
from runtime.cache import Cache, default_cache
from runtime.cli import main
from runtime.executor import HostExecutor
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


def test_cache_info_and_clear(cache_dir: Path, capsys) -> None:
    HostExecutor(wat(MODULE))
    HostExecutor(wat(MODULE))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "1 hits, 1 misses" in out and "obj: 1 entries" in out
    assert main(["cache", "clear"]) == 0
    assert not cache_dir.exists()
