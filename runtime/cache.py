"""The compiled-code cache: PTX, cubins and native object code, in memory and on disk.

One entry maps a key (a hash of the Wasm module, the compiler version and a hash of its
source, the target and its PTX ISA, the LLVM version and the compile options) to the bytes of one
compilation; a cubin (the driver JIT's output for one PTX module) is keyed by the PTX's hash,
the device's capability and the driver version. The directory is ``$TENSORWASM_CACHE_DIR``,
else the user cache directory (``$XDG_CACHE_HOME/tensorwasm`` or ``~/.cache/tensorwasm``);
``$TENSORWASM_CACHE=off`` turns caching off (both read by :mod:`tensorwasm.support.config`).

Entries are code this process runs (native objects, cubins, wasmtime's compiled modules)
and the records it builds from them, so nobody else may be able to write one:

- The directory must belong to the user and be writable by nobody else, as ssh requires of
  ``~/.ssh``; another one is refused with one warning, and the run goes on without the
  cache. What the cache creates is the user's alone (folders 0700, files 0600).
- On disk an entry is a file holding a magic word, a MAC of its kind, key and payload
  (keyed BLAKE2b-256, RFC 7693's MAC mode: a third of HMAC-SHA256's time over the ~0.3 MB
  a warm start reads), and the payload. The MAC's key is a secret kept in the directory (``key``,
  0600, made at first use), so a payload that is not this user's own output (planted,
  copied from another entry, or damaged) does not check and is never used.
- An entry is written to a temporary file and renamed into place, so concurrent processes
  never see half of one. Whatever is found at an entry's path that is not a whole entry
  of this user (a short, damaged or foreign file, a FIFO, a folder, a symlink) is ignored,
  with one warning a process, and rebuilt; it is opened without following links and
  without blocking, so nothing there can hang a run.

Hits and misses are appended, one line a process, to ``counts`` (``O_APPEND``: concurrent
processes lose none), which ``tensorwasm cache info`` sums. ``tensorwasm cache clear``
removes what the cache wrote, recognised by name and content, and nothing else.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import os
import stat
import tempfile
from pathlib import Path

import llvmlite

from tensorwasm.compiler import COMPILER_VERSION
from tensorwasm.support import logs
from tensorwasm.support.config import cache_dir, cache_enabled
from tensorwasm.support.digest import sha256

try:  # BLAKE2b without importing hashlib (and OpenSSL)
    from _blake2 import blake2b as _blake2b
except ImportError:  # another Python
    from hashlib import blake2b as _blake2b
try:  # hmac.compare_digest without importing hmac (and hashlib, and OpenSSL)
    from _operator import _compare_digest as _same_digest
except ImportError:  # another Python
    from hmac import compare_digest as _same_digest

log = logs.get_logger(__name__)
MAGIC = b"TWC3"  # then the MAC (32 bytes), then the payload
# Entries of earlier releases (then a SHA-256; an HMAC-SHA256): replaced quietly.
EARLIER_MAGICS = (b"TWC1", b"TWC2")
HEADER = len(MAGIC) + 32
KEY_FILE = "key"  # the MAC's secret
KEY_BYTES = 32
COUNTS_FILE = "counts"  # "hits misses" lines, one a process
EARLIER_FILES = ("stats.json",)  # what earlier releases kept at the top of the directory
FINGERPRINTS = "fingerprints"  # the compiler's fingerprint by its sources' listing
TEMPORARY = ".tmp-"
# The kinds this release writes (others are recognised by their entries alone).
KINDS = (
    "ptx",
    "cubin",
    "obj",
    "prepared",
    "aot",
    "cwasm",
    "calibration",
    "device",
    "no-gpu",
    "launched",
    "so",
    "host-kernels",
    "lib",  # (host kernels' libraries on their way to dlopen, under TEMPORARY names)
    FINGERPRINTS,
)
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HEX = b"0123456789abcdef"


class Refused(OSError):
    """What is at a path of the cache is not what the cache wrote there (why: its text)."""


def _is_hex_name(name: str, length: int = 64) -> bool:
    return len(name) == length and not name.strip("0123456789abcdef")


# What os.open says of a symlink (O_NOFOLLOW), a FIFO nobody reads (O_NONBLOCK, to write),
# a folder (to write), and a path through a file.
_NOT_REGULAR = (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR)


def _open_own(
    path: Path | str, flags: int = os.O_RDONLY, dir_fd: int | None = None
) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path`` of this user, and its status (never a link
    followed, nor a FIFO waited on); Refused for anything else at the path, OSError where
    nothing is there."""
    try:
        fd = os.open(path, flags | _OPEN, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_REGULAR:
            raise Refused(f"not a regular file ({exc.strerror})") from exc
        raise
    found = os.fstat(fd)
    why = None
    if not stat.S_ISREG(found.st_mode):
        why = "not a regular file"
    elif found.st_uid != os.geteuid():
        why = f"owned by user {found.st_uid}"
    if why is not None:
        os.close(fd)
        raise Refused(why)
    return fd, found


def _read_own(path: Path | str, limit: int = 1 << 40, dir_fd: int | None = None) -> tuple[bytes, int]:
    """The bytes (at most ``limit``) and the mode of the regular file ``path`` of this user
    (see :func:`_open_own`)."""
    fd, found = _open_own(path, dir_fd=dir_fd)
    try:
        chunks = []
        total = 0
        want = min(found.st_size + 1, limit)  # one read, where the file is as its status says
        while total < limit:
            chunk = os.read(fd, min(want, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = 1 << 20
        return b"".join(chunks), stat.S_IMODE(found.st_mode)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Take away what is at ``path`` (a file, a link, a FIFO, an empty folder): the cache
    writes its own there. A folder with something in it stays (and the entry uncached)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass


# Told apart from any other use of a keyed BLAKE2b (its personalisation, 16 bytes).
_PERSON = b"tensorwasm cache"


def _mac(secret: bytes, kind: str, key: str, payload: bytes) -> bytes:
    """Keyed BLAKE2b-256 (RFC 7693) under ``secret`` of the entry's kind, key and payload."""
    mac = _blake2b(digest_size=32, key=secret, person=_PERSON)
    mac.update(b"%s\0%s\0" % (kind.encode(), key.encode()))
    mac.update(payload)
    return mac.digest()


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of the compiler's own source: code from another build is never reused.

    Reading every source costs a warm start ~5 to 10 ms, so the hash is kept in the cache
    directory under a hash of each source's name, size and modification time (~0.3 ms to
    list): a source that changes gets a new modification time, and is read again."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    sources = sorted(_sources(root, ("dialect", "compiler")))
    listing = sha256()
    for name, stat_ in sources:
        listing.update(f"{root}/{name}\0{stat_.st_size}\0{stat_.st_mtime_ns}\0".encode())
    cache = default_cache()
    kept = Path(FINGERPRINTS) / listing.hexdigest()
    use_kept = cache.usable()
    if use_kept:
        text = cache.read_file(kept, limit=65)
        if text is not None and len(text) == 64 and not text.strip(_HEX):
            return text.decode("ascii")
        if text is not None:
            cache.damaged(cache.directory / kept, "not a fingerprint")
    digest = sha256()
    for name, _ in sources:
        digest.update(name.encode())
        with open(os.path.join(root, name), "rb") as file:
            digest.update(file.read())
    found = digest.hexdigest()
    if use_kept:
        cache.write_file(kept, found.encode())  # where it cannot: the next start reads the sources
    return found


def _sources(root: str, folders: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    """The Python sources under ``root``'s ``folders`` (their names relative to ``root``,
    with "/"), with their status: :func:`os.scandir`'s walk (pathlib's ``rglob`` costs a
    warm start ~1 ms more)."""
    found = []
    pending = list(folders)
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(root, folder)))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(f"{folder}/{entry.name}")
            elif entry.name.endswith(".py"):
                found.append((f"{folder}/{entry.name}", entry.stat()))
    return found


def make_key(*parts: object) -> str:
    """The key of a compilation: every input that can change its output, hashed."""
    text = json.dumps([COMPILER_VERSION, compiler_fingerprint(), llvmlite.__version__, *map(str, parts)])
    return sha256(text.encode()).hexdigest()


def _sum_counts(text: bytes) -> tuple[int, int, bool]:
    """The hits and misses of the counts file ``text``, and whether all of it is lines of counts."""
    *lines, tail = text.split(b"\n")  # (tail: b"" after the last line's newline)
    hits = misses = good = 0
    for line in lines:
        parts = line.split(b" ")
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            hits, misses, good = hits + int(parts[0]), misses + int(parts[1]), good + 1
    return hits, misses, good == len(lines) and not tail


class Cache:
    """Compiled code by key; ``kind`` ("ptx", "cubin", "obj", "prepared": see
    :mod:`runtime.prepared`, "cwasm": wasmtime's code for a rewritten module) names the
    subdirectory. An entry read back is this user's own, whole (see the module)."""

    def __init__(self, directory: Path | None = None, enabled: bool = True):
        self.directory = directory or cache_dir()
        self.enabled = enabled
        self.memory: dict[tuple[str, str], bytes] = {}
        self.hits = 0
        self.misses = 0
        self._uncounted: dict[str, int] = {}  # hits and misses not yet in the counts file
        self._trusted: bool | None = None  # the directory checked: see usable()
        self._secret: bytes | None = None
        self._warned = False  # of a damaged entry, this process

    def usable(self) -> bool:
        """Whether the directory can be used: caching is on, and the directory (made 0700
        where it is missing) belongs to this user and is writable by nobody else; checked
        once, and a refusal warned of once."""
        if not self.enabled:
            return False
        if self._trusted is None:
            why = self._distrust()
            self._trusted = why is None
            if why is not None:
                log.warning(
                    "not using the cache directory %s: %s; running without the cache", self.directory, why
                )
        return self._trusted

    def _distrust(self) -> str | None:
        """Why the directory may not be used (None: it may)."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            found = os.stat(self.directory)
        except OSError as exc:
            return exc.strerror or str(exc)
        if not stat.S_ISDIR(found.st_mode):
            return "not a directory"
        if found.st_uid != os.geteuid():
            return f"it belongs to user {found.st_uid}, not to this user ({os.geteuid()})"
        if found.st_mode & 0o022:
            mode = stat.S_IMODE(found.st_mode)
            return (
                f"group or others may write in it (mode {mode:03o}; `chmod go-w {self.directory}` allows it)"
            )
        return None

    def _path(self, kind: str, key: str) -> Path:
        return self.directory / kind / f"{key}.bin"

    def has(self, kind: str, key: str) -> bool:
        """Whether an entry is there (held in memory, or its file exists); whether it reads
        back whole and under its code is :meth:`get`'s to say."""
        if not self.enabled:
            return False
        if (kind, key) in self.memory:
            return True
        return self.usable() and self._path(kind, key).is_file()

    def get(self, kind: str, key: str) -> bytes | None:
        if not self.enabled:
            self.misses += 1
            return None
        data = self.memory.get((kind, key))
        if data is None and self.usable():
            data = self._read(kind, key)
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
        if not self.usable():
            return
        secret = self._key()
        if secret is not None:
            self.write_file(Path(kind) / f"{key}.bin", MAGIC + _mac(secret, kind, key, data) + data)

    def drop(self, kind: str, key: str) -> None:
        """Forget one entry (e.g. a cubin the driver no longer accepts)."""
        self.memory.pop((kind, key), None)
        if self.usable():
            _remove(self._path(kind, key))

    def _read(self, kind: str, key: str) -> bytes | None:
        path = self._path(kind, key)
        try:
            blob = _read_own(path)[0]
        except Refused as exc:
            self.damaged(path, str(exc))
            return None
        except OSError:  # none there (a miss), or unreadable: rebuilt and rewritten
            return None
        magic = blob[:4]
        if magic in EARLIER_MAGICS:
            log.info("replacing the cache entry %s of an earlier release", path)
            return None
        secret = self._key()
        if secret is None:
            return None
        data = blob[HEADER:]
        if magic != MAGIC or not _same_digest(_mac(secret, kind, key, data), blob[4:HEADER]):
            self.damaged(path, "damaged, or not written by this user's cache")
            return None
        return data

    def damaged(self, path: Path, why: str) -> None:
        """Ignore what is at ``path`` and take it away (the cache writes its own there; not
        in a directory it refused), with a warning for the first such path of a process."""
        if self._warned:
            log.info("ignoring the cache entry %s: %s", path, why)
        else:
            self._warned = True
            log.warning(
                "ignoring the cache entry %s: %s%s", path, why, "; it is rebuilt" if self._trusted else ""
            )
        if self._trusted:
            _remove(path)

    def read_file(self, name: Path, limit: int = 1 << 40) -> bytes | None:
        """The bytes (at most ``limit``) of the file ``name`` (relative to the directory)
        that this user's cache wrote; None where there is none, and where something else is
        there (taken away)."""
        path = self.directory / name
        try:
            return _read_own(path, limit)[0]
        except Refused as exc:
            self.damaged(path, str(exc))
        except OSError:
            pass
        return None

    def write_file(self, name: Path, data: bytes) -> bool:
        """Write the file ``name`` (relative to the directory; its folder made 0700 where
        missing) whole or not at all, 0600; False (logged) where it cannot."""
        path = self.directory / name
        try:
            if path.parent != self.directory:
                self._folder(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMPORARY)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                try:
                    os.replace(tmp, path)
                except IsADirectoryError:  # a folder where the file goes: it is the cache's place
                    self.damaged(path, "a folder")
                    os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:  # a read-only or full disk costs speed, never correctness
            log.warning("cannot write the cache file %s: %s", path, exc)
            return False
        return True

    def _folder(self, path: Path) -> None:
        """Make the directory's subfolder ``path`` (0700) where it is missing; anything
        else at its place is taken away first."""
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return
            self.damaged(path, "not a folder")
        except FileNotFoundError:
            pass
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile by another thread of this process, or another process
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise

    def _key(self) -> bytes | None:
        """The MAC's secret: read from the directory, or made there (None, warned of,
        where neither can be done)."""
        if self._secret is not None:
            return self._secret
        path = self.directory / KEY_FILE
        for _ in range(3):  # made by another process between our attempts: read it
            try:
                found, mode = _read_own(path, KEY_BYTES + 1)
                if len(found) == KEY_BYTES and not mode & 0o077:
                    self._secret = found
                    return found
                raise Refused("not a key of this cache (its size, or others may read it)")
            except Refused as exc:
                self.damaged(path, str(exc))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot read the cache's key %s: %s; running without the cache", path, exc)
                self._trusted = False
                return None
            try:
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=TEMPORARY)
                try:
                    with os.fdopen(fd, "wb") as out:
                        out.write(os.urandom(KEY_BYTES))
                    os.link(tmp, path)  # never over a key another process just made
                finally:
                    os.unlink(tmp)
            except FileExistsError:
                continue
            except OSError as exc:
                log.warning("cannot make the cache's key %s: %s; running without the cache", path, exc)
                self._trusted = False
                return None
        return None

    def _count(self, field: str) -> None:
        """Count a hit or a miss, written to the directory's counts at the process's exit (a
        start looks entries up several times; writing each cost it ~1 ms)."""
        if not self._uncounted:
            atexit.register(self.write_counts)
        self._uncounted[field] = self._uncounted.get(field, 0) + 1

    def write_counts(self) -> None:
        """Append the hits and misses counted so far to the directory's, for ``tensorwasm
        cache info``: one line, in one write to a file opened to append, so the lines of
        concurrent processes all arrive (best effort)."""
        uncounted, self._uncounted = self._uncounted, {}
        if not uncounted:
            return
        atexit.unregister(self.write_counts)
        if not self.usable():
            return
        line = b"%d %d\n" % (uncounted.get("hits", 0), uncounted.get("misses", 0))
        path = self.directory / COUNTS_FILE
        for _ in range(2):
            try:
                fd = _open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)[0]
            except Refused as exc:
                self.damaged(path, str(exc))
                continue
            except OSError:
                return
            try:
                os.write(fd, line)
            except OSError:
                pass
            finally:
                os.close(fd)
            return

    def counts(self) -> dict[str, int]:
        """The hits and misses of every process, summed. A counts file of another shape is
        first rewritten with the lines it had right (lines appended to it meanwhile are
        lost: a process's line appended to a damaged last line would be too)."""
        found = self.read_file(Path(COUNTS_FILE))
        if found is not None:
            hits, misses, whole = _sum_counts(found)
            if not whole:
                self.damaged(self.directory / COUNTS_FILE, "not lines of counts")
                if self.usable():  # (a directory refused is only read)
                    self.write_file(Path(COUNTS_FILE), b"%d %d\n" % (hits, misses))
        self.write_counts()
        found = self.read_file(Path(COUNTS_FILE))
        hits, misses, _ = _sum_counts(found or b"")
        return {"hits": hits, "misses": misses}

    def info(self) -> dict:
        counts = self.counts()
        entries = {}
        total = 0
        for kind_dir in sorted(p for p in self.directory.glob("*") if p.is_dir() and not p.is_symlink()):
            # (entries are KEY.bin; the compiler's fingerprints are kept under their listing's hash)
            files = [f for f in kind_dir.iterdir() if f.is_file() and not f.name.startswith(TEMPORARY)]
            size = sum(f.stat().st_size for f in files)
            entries[kind_dir.name] = {"entries": len(files), "bytes": size}
            total += size
        return {"directory": str(self.directory), "kinds": entries, "bytes": total, **counts}

    def clear(self) -> Cleared:
        """Remove what the cache wrote in the directory, and nothing else (see :class:`Cleared`)."""
        self.memory.clear()
        self._uncounted.clear()  # (write_counts stays registered: it finds nothing to write)
        self._secret = None
        cleared = Cleared(self.directory)
        try:
            top = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return cleared
        cleared.found = True
        try:
            cleared.sweep_top(top)
        finally:
            os.close(top)
        if cleared.removed and not cleared.left:
            try:
                os.rmdir(self.directory)
            except OSError:
                pass
        return cleared


class Cleared:
    """What :meth:`Cache.clear` removed: by kind, (files, bytes); and the names it left
    (what the cache did not write). Everything goes through descriptors of the folders,
    never a path that a link could turn elsewhere."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.found = False  # the directory exists
        self.removed: dict[str, list[int]] = {}
        self.left: list[str] = []

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.removed.values())

    def sweep_top(self, top: int) -> None:
        for entry in sorted(os.scandir(top), key=lambda e: e.name):
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                self._sweep_kind(top, name)
            elif self._ours_at_top(top, name):
                self._take(top, name, "other")
            else:
                self.left.append(name)

    def _ours_at_top(self, top: int, name: str) -> bool:
        if name.startswith(TEMPORARY):
            return True
        if name not in (KEY_FILE, COUNTS_FILE, *EARLIER_FILES):
            return False
        try:
            found = _read_own(name, 1 << 20, dir_fd=top)[0]
        except OSError:
            return False
        if name == KEY_FILE:
            return len(found) == KEY_BYTES
        if name == COUNTS_FILE:
            return not found.replace(b" ", b"").replace(b"\n", b"").strip(b"0123456789")
        try:
            return isinstance(json.loads(found), dict)
        except ValueError:
            return False

    def _sweep_kind(self, top: int, kind: str) -> None:
        try:
            folder = os.open(kind, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        except OSError:
            self.left.append(kind)
            return
        took = 0
        kept = 0
        try:
            for entry in os.scandir(folder):
                if self._ours_in_kind(folder, kind, entry.name):
                    self._take(folder, entry.name, kind)
                    took += 1
                else:
                    self.left.append(f"{kind}/{entry.name}")
                    kept += 1
        finally:
            os.close(folder)
        if not kept and (took or kind in KINDS):
            try:
                os.rmdir(kind, dir_fd=top)
            except OSError:
                pass

    @staticmethod
    def _ours_in_kind(folder: int, kind: str, name: str) -> bool:
        if name.startswith(TEMPORARY):
            return True
        fingerprint = kind == FINGERPRINTS and _is_hex_name(name)
        if not fingerprint and not (name.endswith(".bin") and _is_hex_name(name[:-4])):
            return False
        try:
            found = _read_own(name, 65 if fingerprint else 4, dir_fd=folder)[0]
        except OSError:
            return False
        if fingerprint:
            return len(found) == 64 and not found.strip(_HEX)
        return found == MAGIC or found in EARLIER_MAGICS

    def _take(self, folder: int, name: str, kind: str) -> None:
        try:
            size = os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
            os.unlink(name, dir_fd=folder)
        except OSError:
            self.left.append(name)
            return
        row = self.removed.setdefault(kind, [0, 0])
        row[0] += 1
        row[1] += size


def cubin_key(ptx: bytes, arch: str, driver_version: int, assembler: str = "driver") -> str:
    """Cubins are keyed by what makes them: the PTX, the device, the driver, and the
    assembler (ptxas and its release, or the driver's JIT)."""
    parts = [sha256(ptx).digest(), arch.encode(), b"%d" % driver_version, assembler.encode()]
    return sha256(b"|".join(parts)).hexdigest()


def kernels_cubin_key(context, ptx: bytes) -> str:
    """The key :func:`load_kernels` files the cubin of ``ptx`` under on ``context``: made
    by the ptxas found (:mod:`runtime.assembler`), or by the driver's JIT."""
    return device_cubin_key(context.info, ptx)


def device_cubin_key(info, ptx: bytes) -> str:
    """:func:`kernels_cubin_key` from the device's description (a
    :class:`~runtime.device_info.DeviceInfo`) alone: no context needed."""
    from tensorwasm.runtime import assembler

    found = assembler.ptxas()
    made_by = f"ptxas {found[1][0]}.{found[1][1]} {found[0]}" if found else "driver"
    return cubin_key(ptx, info.arch, info.driver_version, made_by)


def _assembles_ahead(info, cache: Cache) -> bool:
    """Whether ptxas can make the device's cubins before a launch: the cache keeps them, and
    a ptxas no newer than the driver is found (else the driver's JIT makes each at its load)."""
    from tensorwasm.runtime import assembler

    found = assembler.ptxas()
    return cache.enabled and found is not None and found[1] <= divmod(info.driver_version // 10, 100)


def cubin_ready(info, ptx: bytes, cache: Cache | None = None) -> bool:
    """Whether the first load of ``ptx`` on the device ``info`` describes finds its cubin
    in the cache, or has nothing to gain from one made ahead (see :func:`assemble_ahead`)."""
    cache = cache or default_cache()
    return not _assembles_ahead(info, cache) or cache.has("cubin", device_cubin_key(info, ptx))


def assemble_ahead(info, ptx: bytes, cache: Cache | None = None) -> bool:
    """ptxas's cubin of ``ptx`` for the device ``info`` describes, made now (where a kernel
    compiles, or on a worker before a warm run's first launch: before the device's context
    exists, with no CUDA call) and filed where :func:`load_kernels` looks first, so that the
    kernel's first load runs no ptxas and no driver JIT (ptxas takes 20 to 50 ms a kernel,
    which a launch waiting for it paid). False where there is none to file (the cache off,
    no ptxas, one newer than the driver, or a module ptxas refuses: the load then goes the
    usual way); a ptxas crash raises :class:`runtime.assembler.AssemblerCrash`."""
    from tensorwasm.runtime import assembler

    cache = cache or default_cache()
    if not _assembles_ahead(info, cache):
        return False
    key = device_cubin_key(info, ptx)
    if cache.has("cubin", key):
        return True
    cubin = assembler.assemble(ptx, info.arch, info.driver_version)
    if cubin is None:
        return False
    cache.put("cubin", key, cubin)
    return True


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
