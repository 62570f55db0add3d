"""The cache cannot be turned against its user: what it hands back is this user's own
output, checked by a MAC (keyed BLAKE2b) under a secret nobody else can read; prepared modules are
records read through an allow-list, never unpickled; a directory others can write is
refused; damage of any kind heals; ``cache clear`` removes only the cache's own files;
concurrent processes' counts all arrive."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tensorwasm.dialect.types import I32
from tensorwasm.runtime import cache as cache_module
from tensorwasm.runtime.cache import HEADER, MAGIC, Cache, default_cache
from tensorwasm.runtime.cli import main
from tensorwasm.runtime.executor import HostExecutor
from tensorwasm.support.digest import sha256
from tensorwasm.support.serial import Custom, Schema, SerialError
from tests.conftest import ROOT, wat
from tests.runtime.test_run import plain_wasmtime

SQUARE = '(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.mul))'
DOUBLE = '(module (func (export "sq") (param i32) (result i32) local.get 0 local.get 0 i32.add))'
PROGRAM = ROOT / "examples/wasi/build/histogram.O2.wasm"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Fifos:
    """FIFOs a test makes in the cache. Should the test still run ``WAIT`` seconds on, they
    are opened at both ends (a reader or writer blocked on one returns) and the test fails
    at its end, as one that would have hung."""

    WAIT = 20.0

    def __init__(self) -> None:
        self.made: list[Path] = []
        self.hung = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def make(self, path: Path) -> None:
        os.mkfifo(path)
        self.made.append(path)

    def _watch(self) -> None:
        if self.done.wait(self.WAIT):
            return
        self.hung.set()
        while not self.done.is_set():
            for path in self.made:
                try:
                    os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
                except OSError:
                    pass
            self.done.wait(0.2)


@pytest.fixture
def fifos():
    watch = Fifos()
    yield watch
    watch.done.set()
    watch.thread.join()
    assert not watch.hung.is_set(), "a FIFO in the cache blocked the process"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def _fresh_process() -> None:
    """Forget what this process's cache holds in memory, as a new process would start."""
    default_cache().memory.clear()


# 1. Nothing the cache hands back runs code it was not made from.


class _Plant:
    """A pickle that makes a folder when it is unpickled (as one could run a shell)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_prepared_entry_that_is_a_pickle_is_never_unpickled(cache_dir: Path, tmp_path: Path) -> None:
    from tensorwasm.runtime import prepared as prepared_module
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    wasm = module_bytes("blas1", "O2")
    OffloadModule(wasm, device="cpu")
    (entry,) = (cache_dir / "prepared").iterdir()
    marker = tmp_path / "ran"
    # Even written by the user's own cache (its MAC right), a pickle is not read.
    Cache(cache_dir).put("prepared", entry.stem, pickle.dumps(_Plant(marker)))
    _fresh_process()
    again = OffloadModule(wasm, device="cpu")
    assert not marker.exists()
    assert again.loops and again._wasm is not None  # prepared from scratch
    rewritten = Cache(cache_dir).get("prepared", entry.stem)  # and rewritten as records
    assert rewritten[:4] == prepared_module.MAGIC and prepared_module.load(rewritten) is not None


def test_a_planted_entry_with_its_own_sha256_is_not_used(cache_dir: Path, tmp_path: Path) -> None:
    from tensorwasm.runtime.offload import OffloadModule
    from tests.offload_cases import module_bytes

    wasm = module_bytes("blas1", "O2")
    OffloadModule(wasm, device="cpu")
    (entry,) = (cache_dir / "prepared").iterdir()
    marker = tmp_path / "ran"
    payload = pickle.dumps(_Plant(marker))
    for magic in (b"TWC1", MAGIC):  # the earlier format, and this one with a hash for a MAC
        entry.write_bytes(magic + sha256(payload).digest() + payload)
        _fresh_process()
        again = OffloadModule(wasm, device="cpu")
        assert not marker.exists() and again._wasm is not None


def _swap(cache_dir: Path, kind: str, into: str, source: str) -> None:
    """Copy the entry ``source`` of ``kind`` over the entry ``into``: whole, hash-valid,
    another program's code."""
    (cache_dir / kind / f"{into}.bin").write_bytes((cache_dir / kind / f"{source}.bin").read_bytes())


def test_a_swapped_native_code_entry_is_not_run(cache_dir: Path, caplog) -> None:
    square = HostExecutor(wat(SQUARE))
    double = HostExecutor(wat(DOUBLE))
    _swap(cache_dir, "obj", square.cache_key, double.cache_key)
    _fresh_process()
    again = HostExecutor(wat(SQUARE))
    assert not again.compilation.cached
    assert again.call("sq", [(I32, 12)]).values == ((I32, 144),)  # not 24
    assert len(_warnings(caplog)) == 1


def test_a_swapped_wasmtime_entry_is_not_run(cache_dir: Path) -> None:
    import wasmtime

    from tensorwasm.runtime.offload import _compiled

    engine = wasmtime.Engine()
    square, double = wat(SQUARE), wat(DOUBLE)
    _compiled(engine, square)
    _compiled(engine, double)
    into, source = (cache_module.make_key("cwasm", sha256(w).hexdigest()) for w in (square, double))
    _swap(cache_dir, "cwasm", into, source)
    _fresh_process()
    module = _compiled(engine, square)
    store = wasmtime.Store(engine)
    instance = wasmtime.Instance(store, module, [])
    assert instance.exports(store)["sq"](store, 12) == 144  # not 24


def test_an_entry_moved_to_another_kind_does_not_check(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    cache.put("ptx", "k", b"payload")
    (cache_dir / "obj").mkdir(mode=0o700)
    (cache_dir / "obj" / "k.bin").write_bytes((cache_dir / "ptx" / "k.bin").read_bytes())
    assert Cache(cache_dir).get("ptx", "k") == b"payload"
    assert Cache(cache_dir).get("obj", "k") is None


def test_the_mac_is_keyed_blake2b_under_a_private_key(cache_dir: Path) -> None:
    Cache(cache_dir).put("obj", "k", b"code")
    key = (cache_dir / "key").read_bytes()
    blob = (cache_dir / "obj" / "k.bin").read_bytes()
    assert blob[HEADER:] == b"code"
    mac = hashlib.blake2b(b"obj\0k\0code", digest_size=32, key=key, person=b"tensorwasm cache").digest()
    assert blob[4:HEADER] == mac
    assert (
        blob[4:HEADER]
        != hashlib.blake2b(b"obj\0k\0code", digest_size=32, person=b"tensorwasm cache").digest()
    )
    for path in (cache_dir, cache_dir / "obj"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for path in (cache_dir / "key", cache_dir / "obj" / "k.bin"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_key_others_may_read_or_of_another_size_is_replaced(cache_dir: Path, caplog) -> None:
    Cache(cache_dir).put("obj", "k", b"code")
    key = cache_dir / "key"
    key.chmod(0o644)
    assert Cache(cache_dir).get("obj", "k") is None  # under a new key, the entry does not check
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    Cache(cache_dir).put("obj", "k", b"code")
    key.write_bytes(b"short")
    assert Cache(cache_dir).get("obj", "k") is None
    assert len(key.read_bytes()) == 32
    Cache(cache_dir).put("obj", "k", b"code")
    assert Cache(cache_dir).get("obj", "k") == b"code"


# The records' format: only the allow-list's classes, only their constructors.


def test_reading_refuses_what_the_allow_list_does_not_name() -> None:
    from tensorwasm.runtime.prepared import RECORDS

    for document in (
        ["tensorwasm-records-1", [["system", "command"]], ["system", "touch /tmp/x"]],
        ["tensorwasm-records-1", [["Path", "parts"]], ["Path", "/"]],
        ["tensorwasm-records-1", [], ["LoopStats", "f", 0, "cpu"]],  # a class not in the table
        ["tensorwasm-records-1", [["LoopStats", "func"]], ["LoopStats", "f"]],  # other fields
        ["tensorwasm-records-1", [], {"a": 1}],
        ["tensorwasm-records-1", [], ["@", 0]],
        ["another-format", [], 1],
    ):
        with pytest.raises(SerialError):
            RECORDS.loads(json.dumps(document).encode())
    for blob in (b"\xff\xfe", b"[" * 100_000, b"", pickle.dumps(["a"])):
        with pytest.raises(SerialError):
            RECORDS.loads(blob)


def test_writing_refuses_a_class_the_allow_list_does_not_name() -> None:
    from tensorwasm.runtime import prepared

    class Stranger:
        pass

    with pytest.raises(SerialError):
        prepared.RECORDS.dumps({"x": Stranger()})
    with pytest.raises(prepared.UnwritableError):  # what the offload module catches to go on uncached
        prepared.dump({"x": Stranger()})


def test_records_keep_their_types_and_shared_objects() -> None:
    from tensorwasm.compiler.analysis.poly import Poly, Symbol
    from tensorwasm.runtime.offload import LoopStats

    schema = Schema(
        {
            "tensorwasm.runtime.offload": ("LoopStats",),
            "tensorwasm.compiler.analysis.poly": ("Poly", "Symbol"),
        },
        custom={"Poly": Custom(("terms",)), "Symbol": Custom(("kind", "ref", "name"), state=("order",))},
    )
    stats = LoopStats("f", 4, "cpu", declined={"guard": 2}, warned={"x"}, kernel_seconds=float("inf"))
    k = Symbol("counter", None, "k0")
    poly = Poly.symbol(k) * Poly.symbol(k) + Poly.const(3)
    value = {"stats": [stats, stats], 7: (b"\0\xff", frozenset({1}), -(1 << 70), 0.1), "poly": (poly, k)}
    back = schema.loads(schema.dumps(value))
    assert back[7] == value[7] and back["stats"][0] == stats
    assert back["stats"][0] is back["stats"][1]
    again, k_back = back["poly"]
    assert again.terms == {(k_back, k_back): 1, (): 3} and k_back.order == k.order


# 2. A directory others can write, or that is not the user's, is refused, once, and the run goes on.


def test_a_group_writable_directory_is_refused_with_one_warning_and_the_run_is_right(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o775)
    env = dict(os.environ, TENSORWASM_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tensorwasm", "run", str(PROGRAM), "300", "--device", "cpu"]
    for _ in range(2):
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == plain_wasmtime(PROGRAM, ["300"], tmp_path)[1]
        refusals = [line for line in done.stderr.splitlines() if "not using the cache directory" in line]
        assert len(refusals) == 1 and "mode 775" in refusals[0], done.stderr
    assert list(cache.iterdir()) == []  # nothing written there


def test_a_directory_of_another_user_is_refused_with_one_warning(
    cache_dir: Path, monkeypatch, caplog
) -> None:
    cache_dir.mkdir(mode=0o700)
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # the directory is now someone else's
    for _ in range(2):
        executor = HostExecutor(wat(SQUARE))
        assert executor.call("sq", [(I32, 7)]).values == ((I32, 49),)
    refusals = _warnings(caplog)
    assert len(refusals) == 1 and f"belongs to user {owner}" in refusals[0]
    assert list(cache_dir.iterdir()) == []


def test_info_on_a_refused_directory_changes_nothing_there(cache_dir: Path, capsys, fifos: Fifos) -> None:
    cache_dir.mkdir()
    (cache_dir / "counts").write_bytes(b"not counts")
    (cache_dir / "obj").mkdir()
    fifos.make(cache_dir / "obj" / ("a" * 64 + ".bin"))
    cache_dir.chmod(0o777)
    before = sorted(p.relative_to(cache_dir) for p in cache_dir.rglob("*"))
    assert main(["cache", "info"]) == 0
    assert "obj: 0 entries" in capsys.readouterr().out  # (a FIFO is no entry)
    assert sorted(p.relative_to(cache_dir) for p in cache_dir.rglob("*")) == before
    assert (cache_dir / "counts").read_bytes() == b"not counts"


def test_a_missing_directory_is_made_for_the_user_alone(tmp_path: Path, monkeypatch) -> None:
    old = os.umask(0)
    try:
        Cache(tmp_path / "new" / "cache").put("obj", "k", b"code")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / "cache").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "cache" / "obj" / "k.bin").stat().st_mode) == 0o600


# 3. clear removes what the cache wrote, and says what.


def test_clear_leaves_the_users_files_and_says_what_it_removed(cache_dir: Path, capsys) -> None:
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "letter.txt").write_text("dear")
    (cache_dir / "photos").mkdir()
    (cache_dir / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    (cache_dir / "obj").mkdir(mode=0o700)
    lookalike = cache_dir / "obj" / ("a" * 64 + ".bin")  # an entry's name, not its content
    lookalike.write_bytes(b"mine")
    HostExecutor(wat(SQUARE))
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("removed ") and f"from {cache_dir}: " in out[0] and "obj 1" in out[0]
    assert out[1] == "left 3 files there that are not the cache's"
    assert (cache_dir / "letter.txt").read_text() == "dear"
    assert (cache_dir / "photos" / "a.jpg").exists() and lookalike.read_bytes() == b"mine"
    assert not (cache_dir / "key").exists() and not (cache_dir / "fingerprints").exists()


def test_clear_of_a_folder_that_is_no_cache_removes_nothing(cache_dir: Path, capsys) -> None:
    cache_dir.mkdir()
    (cache_dir / "key").write_text("my door key's number")
    (cache_dir / "thesis.tex").write_text("...")
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"{cache_dir} is not a TensorWasm cache: nothing removed\n"
    assert sorted(p.name for p in cache_dir.iterdir()) == ["key", "thesis.tex"]


def test_clear_says_when_there_is_nothing_to_remove(cache_dir: Path, capsys) -> None:
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"nothing to remove: {cache_dir} does not exist\n"
    cache_dir.mkdir()
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"nothing to remove in {cache_dir}\n"


# 6. Damage of every kind heals: ignored, at most one warning, rewritten.


def _fifo(path: Path, fifos: Fifos) -> None:
    path.unlink()
    fifos.make(path)


def _folder(path: Path, fifos: Fifos) -> None:
    path.unlink()
    path.mkdir()


def _symlink(path: Path, fifos: Fifos) -> None:
    """A link to a copy of the entry itself: whole, its MAC right, and not the entry."""
    path.rename(path.parent / "elsewhere")
    path.symlink_to(path.parent / "elsewhere")


def _truncated(path: Path, fifos: Fifos) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _flipped(path: Path, fifos: Fifos) -> None:
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))


def _text(path: Path, fifos: Fifos) -> None:
    path.write_text("not an entry at all")


@pytest.mark.parametrize("damage", [_truncated, _flipped, _text, _fifo, _folder, _symlink])
def test_a_damaged_entry_heals(cache_dir: Path, caplog, fifos: Fifos, damage) -> None:
    first = HostExecutor(wat(SQUARE))
    entry = cache_dir / "obj" / f"{first.cache_key}.bin"
    damage(entry, fifos)
    _fresh_process()
    again = HostExecutor(wat(SQUARE))
    assert not again.compilation.cached
    assert again.call("sq", [(I32, 3)]).values == ((I32, 9),)
    assert len(_warnings(caplog)) <= 1
    assert entry.is_file() and not entry.is_symlink()
    assert Cache(cache_dir).get("obj", first.cache_key) is not None  # rewritten whole


def test_a_fifo_at_an_entry_path_never_hangs_a_run(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = dict(os.environ, TENSORWASM_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tensorwasm", "run", str(PROGRAM), "300", "--device", "cpu"]
    subprocess.run(command, capture_output=True, cwd=ROOT, env=env, timeout=300, check=True)
    # (kernel code, "obj", is written only where a loop launched: at this size none does)
    kinds = [kind for kind in ("cwasm", "prepared", "obj") if (cache / kind).exists()]
    assert {"cwasm", "prepared"} <= set(kinds)
    for kind in kinds:
        for entry in (cache / kind).iterdir():
            entry.unlink()
            os.mkfifo(entry)
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain_wasmtime(PROGRAM, ["300"], tmp_path)[1]
    assert len([line for line in done.stderr.splitlines() if "ignoring the cache entry" in line]) == 1
    assert all(stat.S_ISREG(e.lstat().st_mode) for kind in kinds for e in (cache / kind).iterdir())


def test_a_prepared_entry_of_the_wrong_structure_is_prepared_again(cache_dir: Path) -> None:
    from tensorwasm.runtime.offload import OffloadModule
    from tensorwasm.runtime.prepared import RECORDS
    from tensorwasm.runtime.prepared import entry as prepared_entry
    from tests.offload_cases import module_bytes

    wasm = module_bytes("blas1", "O2")
    OffloadModule(wasm, device="cpu")
    (entry,) = (cache_dir / "prepared").iterdir()
    for document in (RECORDS.dumps(["not", "a", "prepared", "module"]), b'["tensorwasm-records-1",[],[1,2]]'):
        wrong = prepared_entry([document, b"[]", RECORDS.dumps(())], wasm)
        Cache(cache_dir).put("prepared", entry.stem, wrong)  # its MAC right
        _fresh_process()
        again = OffloadModule(wasm, device="cpu")
        assert again.loops and again._wasm is not None


def test_a_fingerprint_file_of_bad_text_is_read_again_and_rewritten(
    cache_dir: Path, caplog, fifos: Fifos
) -> None:
    cache_module.compiler_fingerprint.cache_clear()
    try:
        first = cache_module.compiler_fingerprint()
        (kept,) = (cache_dir / "fingerprints").iterdir()
        for bad in (b"\xff" * 64, b"g" * 64, b"f" * 65):
            kept.write_bytes(bad)
            cache_module.compiler_fingerprint.cache_clear()
            assert cache_module.compiler_fingerprint() == first
            assert kept.read_text() == first
        kept.unlink()
        fifos.make(kept)
        cache_module.compiler_fingerprint.cache_clear()
        assert cache_module.compiler_fingerprint() == first and kept.is_file()
    finally:
        cache_module.compiler_fingerprint.cache_clear()
    assert len(_warnings(caplog)) <= 1


@pytest.mark.parametrize("counts", [b"[1, 2]", b"\xff\xfe\n", b"3 4\nfive six\n"])
def test_a_counts_file_of_the_wrong_shape_heals(cache_dir: Path, capsys, caplog, counts: bytes) -> None:
    HostExecutor(wat(SQUARE))
    default_cache().write_counts()
    (cache_dir / "counts").write_bytes(counts)
    (cache_dir / "stats.json").write_text("[1, 2]")  # an earlier release's counts, of a wrong shape
    _fresh_process()
    HostExecutor(wat(SQUARE))
    assert main(["cache", "info"]) == 0
    hits, misses = (3, 4) if counts.startswith(b"3 4") else (0, 0)
    assert f"{hits + 1} hits, {misses} misses" in capsys.readouterr().out  # the good lines and this run's
    assert Cache(cache_dir).counts() == {"hits": hits + 1, "misses": misses}
    assert len(_warnings(caplog)) == 1  # healed: the second reading finds nothing wrong


def test_a_counts_path_that_is_no_file_heals(cache_dir: Path, fifos: Fifos) -> None:
    cache = Cache(cache_dir)
    cache.put("ptx", "k", b"x")
    fifos.make(cache_dir / "counts")
    cache.get("ptx", "k")
    cache.write_counts()  # neither hangs nor fails: the FIFO is replaced
    assert Cache(cache_dir).counts() == {"hits": 1, "misses": 0}


# 9. Concurrent processes' counts all arrive.

_COUNTING = """
import sys
from pathlib import Path
from tensorwasm.runtime.cache import Cache

cache = Cache(Path(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    cache._count("hits")
    cache._count("misses")
    cache._count("misses")
    cache.write_counts()
"""


def test_concurrent_processes_counts_all_arrive(cache_dir: Path) -> None:
    cache_dir.mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rounds, processes = 200, 4
    running = [
        subprocess.Popen([sys.executable, "-c", _COUNTING, str(cache_dir), str(rounds)], cwd=ROOT, env=env)
        for _ in range(processes)
    ]
    assert [p.wait(timeout=300) for p in running] == [0] * processes
    info = Cache(cache_dir).info()
    assert (info["hits"], info["misses"]) == (rounds * processes, 2 * rounds * processes)
