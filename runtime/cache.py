"""The compiled-code cache: PTX, cubins and native object code, in memory and on disk.

One entry maps a key (a hash of the Wasm module, the compiler version and a hash of its
source, the target and its PTX ISA, the LLVM version and the compile options) to the bytes of one
compilation; a cubin (the driver JIT's output for one PTX module) is keyed by the PTX's hash,
the device's capability and the driver version. On
disk each entry is a file holding a magic word, the sha256 of its payload and the payload;
it is written to a temporary file and renamed into place, so concurrent processes never
see half an entry, and an entry whose hash does not match (truncated, corrupted) is
dropped and rebuilt. The directory is ``$TENSORWASM_CACHE_DIR``, else the user cache
directory (``$XDG_CACHE_HOME/tensorwasm`` or ``~/.cache/tensorwasm``); ``$TENSORWASM_CACHE=off``
turns caching off (both read by :mod:`tensorwasm.support.config`).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import llvmlite
from tensorwasm.compiler import COMPILER_VERSION

from tensorwasm.support import logs
from tensorwasm.support.config import cache_dir, cache_enabled
from tensorwasm.support.digest import sha256

log = logs.get_logger(__name__)
MAGIC = b"TWC1"


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of the compiler's own source: code from another build is never reused.

    Reading every source costs a warm start ~5 to 10 ms, so the hash is kept in the cache
    directory under a hash of each source's name, size and modification time (~0.3 ms to
    list): a source that changes gets a new modification time, and is read again."""
    root = Path(__file__).resolve().parents[1]
    sources = sorted(path for package in ("dialect", "compiler") for path in (root / package).rglob("*.py"))
    listing = sha256()
    for path in sources:
        stat = path.stat()
        listing.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    kept = cache_dir() / "fingerprints" / listing.hexdigest()
    use_kept = cache_enabled()
    if use_kept:
        try:
            found = kept.read_text()
            if len(found) == 64:
                return found
        except OSError:
            pass
    digest = sha256()
    for path in sources:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    found = digest.hexdigest()
    if use_kept:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=kept.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as out:
                out.write(found)
            os.replace(tmp, kept)
        except OSError as exc:  # costs the next start a few milliseconds, nothing else
            log.info("cannot keep the compiler's fingerprint: %s", exc)
    return found


def make_key(*parts: object) -> str:
    """The key of a compilation: every input that can change its output, hashed."""
    text = json.dumps([COMPILER_VERSION, compiler_fingerprint(), llvmlite.__version__, *map(str, parts)])
    return sha256(text.encode()).hexdigest()


class Cache:
    """Compiled code by key; ``kind`` ("ptx", "cubin", "obj", "prepared": see
    :mod:`runtime.prepared`, "cwasm": wasmtime's code for a rewritten module) names the
    subdirectory. Each entry carries its hash, which finds corruption (not tampering: like
    wasmtime's own cache, the directory is trusted as the user's own files are)."""

    def __init__(self, directory: Path | None = None, enabled: bool = True):
        self.directory = directory or cache_dir()
        self.enabled = enabled
        self.memory: dict[tuple[str, str], bytes] = {}
        self.hits = 0
        self.misses = 0
        self._uncounted: dict[str, int] = {}  # hits and misses not yet in stats.json

    def _path(self, kind: str, key: str) -> Path:
        return self.directory / kind / f"{key}.bin"

    def get(self, kind: str, key: str) -> bytes | None:
        if not self.enabled:
            self.misses += 1
            return None
        data = self.memory.get((kind, key))
        if data is None:
            data = self._read(self._path(kind, key))
            if data is not None:
                self.memory[(kind, key)] = data
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        self._count("hits" if data is not None else "misses")
        return data

    def put(self, kind: str, key: str, data: bytes) -> None:
        if not self.enabled:
            return
        self.memory[(kind, key)] = data
        path = self._path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            blob = MAGIC + sha256(data).digest() + data
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only or full disk costs speed, never correctness
            log.warning("cannot write the cache entry %s: %s", path, exc)

    def drop(self, kind: str, key: str) -> None:
        """Forget one entry (e.g. a cubin the driver no longer accepts)."""
        self.memory.pop((kind, key), None)
        self._path(kind, key).unlink(missing_ok=True)

    def _read(self, path: Path) -> bytes | None:
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        data = blob[36:]
        if blob[:4] != MAGIC or sha256(data).digest() != blob[4:36]:
            log.warning("dropping the corrupted cache entry %s", path)
            path.unlink(missing_ok=True)
            return None
        return data

    def _count(self, field: str) -> None:
        """Count a hit or a miss, written to the directory's counts at the process's exit (a
        start looks entries up several times; writing each cost it ~1 ms)."""
        if not self._uncounted:
            atexit.register(self.write_counts)
        self._uncounted[field] = self._uncounted.get(field, 0) + 1

    def write_counts(self) -> None:
        """Add the hits and misses counted so far to the directory's, across processes, for
        ``tensorwasm cache info`` (best effort)."""
        uncounted, self._uncounted = self._uncounted, {}
        if not uncounted:
            return
        atexit.unregister(self.write_counts)
        path = self.directory / "stats.json"
        try:
            counts = json.loads(path.read_text()) if path.exists() else {}
            for field, count in uncounted.items():
                counts[field] = counts.get(field, 0) + count
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "w") as out:
                json.dump(counts, out)
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass

    def info(self) -> dict:
        self.write_counts()
        entries = {}
        total = 0
        for kind_dir in sorted(p for p in self.directory.glob("*") if p.is_dir()):
            # (entries are KEY.bin; the compiler's fingerprints are kept under their listing's hash)
            files = [f for f in kind_dir.iterdir() if f.is_file() and not f.name.startswith(".tmp-")]
            size = sum(f.stat().st_size for f in files)
            entries[kind_dir.name] = {"entries": len(files), "bytes": size}
            total += size
        stats_path = self.directory / "stats.json"
        try:
            counts = json.loads(stats_path.read_text())
        except (OSError, ValueError):
            counts = {}
        return {"directory": str(self.directory), "kinds": entries, "bytes": total,
                "hits": counts.get("hits", 0), "misses": counts.get("misses", 0)}  # fmt: skip

    def clear(self) -> None:
        self.memory.clear()
        self._uncounted.clear()  # (write_counts stays registered: it finds nothing to write)
        shutil.rmtree(self.directory, ignore_errors=True)


def cubin_key(ptx: bytes, arch: str, driver_version: int, assembler: str = "driver") -> str:
    """Cubins are keyed by what makes them: the PTX, the device, the driver, and the
    assembler (ptxas and its release, or the driver's JIT)."""
    parts = [sha256(ptx).digest(), arch.encode(), b"%d" % driver_version, assembler.encode()]
    return sha256(b"|".join(parts)).hexdigest()


def kernels_cubin_key(context, ptx: bytes) -> str:
    """The key :func:`load_kernels` files the cubin of ``ptx`` under on ``context``: made
    by the ptxas found (:mod:`runtime.assembler`), or by the driver's JIT."""
    from tensorwasm.runtime import assembler

    found = assembler.ptxas()
    made_by = f"ptxas {found[1][0]}.{found[1][1]} {found[0]}" if found else "driver"
    return cubin_key(ptx, context.info.arch, context.info.driver_version, made_by)


def load_kernels(context, ptx: bytes, cache: Cache | None = None):
    """Load PTX on ``context`` through the cubin cache: a hit skips the driver's JIT.

    A cached cubin the driver refuses (another driver build wrote it) is dropped and
    rebuilt; with the cache off this is :meth:`runtime.driver.Context.load_module`.
    """
    from tensorwasm.runtime import assembler
    from tensorwasm.runtime.driver import CudaError, ptx_entries

    cache = cache or default_cache()
    if not cache.enabled:
        return context.load_module(ptx)
    found = assembler.ptxas()
    key = kernels_cubin_key(context, ptx)
    entries = ptx_entries(ptx)
    cubin = cache.get("cubin", key)
    if cubin is not None:
        try:
            return context.load_cubin(cubin, entries)
        except CudaError as exc:
            if exc.sticky:
                raise
            log.warning("dropping a cached cubin the driver refuses: %s", exc)
            cache.drop("cubin", key)
    cubin = context.link_cubin(ptx)
    try:
        module = context.load_cubin(cubin, entries)
    except CudaError as exc:
        if exc.sticky or found is None:
            raise
        # ptxas's cubin, which this driver refuses: the driver's own linker makes one.
        log.info("the driver refuses ptxas's cubin (%s): its JIT links the module", exc)
        cubin = context.link_cubin(ptx, assemble=False)
        module = context.load_cubin(cubin, entries)
    cache.put("cubin", key, cubin)
    return module


_DEFAULT: Cache | None = None


def default_cache() -> Cache:
    """The process's cache; ``TENSORWASM_CACHE=off`` turns it off (compile everything)."""
    global _DEFAULT
    enabled = cache_enabled()
    if _DEFAULT is None or _DEFAULT.directory != cache_dir() or _DEFAULT.enabled != enabled:
        _DEFAULT = Cache(enabled=enabled)
    return _DEFAULT
