"""The GPU this machine's last process found, so a warm start need not wait for CUDA.

Creating the CUDA context takes ~0.24 s on an H100. A warm ``tensorwasm run`` needs the
device's compute capability and driver version (its cache keys name the target) long
before its first launch, and a run whose loops all stay on the CPU needs nothing else.
So the description a context gave is kept in the cache, under a fingerprint of what the
operating system says without the driver: the kernel module's version, the NVIDIA PCI
devices (with each GPU's UUID where the driver's proc files show it) and the device
selection in the environment. A new driver, another GPU or another selection finds
nothing and waits for the context; what is found is checked against the context at the
first launch (:class:`runtime.offload.OffloadModule`).

Where the driver found no GPU, and the system shows no trace of one (no NVIDIA kernel
module, no ``/dev/nvidia*`` or ``/dev/dxg`` node), that is kept as well, under a
fingerprint that also covers what could bring one: the NVIDIA PCI devices, the libraries
WSL provides, the dynamic linker's cache (which every library install rewrites), the
library path and the device selection. ``--device auto`` then takes the host backend
without loading the CUDA libraries (~35 ms) to be told so again; ``--device gpu`` always
asks the driver.

Whether a module's last run launched anything, or would have with the device started
with it, is kept too: ``tensorwasm run`` makes the context on a thread while it starts,
which a run whose loops all stay on the CPU pays for (importing the CUDA bindings on that
thread holds Python's interpreter lock: ~0.2 s of a 0.5 s run on the H100 machine). Where
the GPU is remembered and the module's last run here neither launched nor had arrivals
whose gains would have paid for the whole start (a program whose loops all came before a
context begun late could be made, PolyBench's deriche), no thread is started; should this
run launch after all, its first launch makes the context.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from tensorwasm.runtime.cache import default_cache, make_key
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.support import config, logs, records
from tensorwasm.support.digest import hexdigest, sha256

log = logs.get_logger(__name__)

# Where the operating system describes the driver and the devices (patched by the tests).
PROC = Path("/proc/driver/nvidia")
SYS_MODULE = Path("/sys/module/nvidia/version")
PCI = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"
DEV = Path("/dev")
WSL_LIBRARIES = Path("/usr/lib/wsl/lib")
LINKER_CACHE = Path("/etc/ld.so.cache")


def fingerprint() -> str | None:
    """A hash of the driver's version and the NVIDIA devices, or None where the operating
    system does not say (then nothing is remembered). Read once per process and selection."""
    return _fingerprint(PROC, SYS_MODULE, PCI, config.cuda_selection())


@functools.cache
def _fingerprint(proc: Path, sys_module: Path, pci: Path, selection: tuple[str | None, ...]) -> str | None:
    driver = _read(proc / "version") or _read(sys_module)
    if not driver:
        return None
    gpus = [f"{entry.name} {_read(entry / 'device').strip()} {_read(proc / 'gpus' / entry.name / 'information')}"
            for entry in _nvidia_devices(pci)]  # fmt: skip
    if not gpus:
        return None
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: it differs from one not set.
    parts = [
        driver,
        *gpus,
        *(f"{name}={value!r}" for name, value in zip(config.CUDA_SELECTION, selection, strict=True)),
    ]
    return sha256("\0".join(parts).encode()).hexdigest()


def _nvidia_devices(pci: Path) -> list[Path]:
    """The NVIDIA display and 3D controllers among the PCI devices."""
    try:
        names = sorted(os.listdir(pci))
    except OSError:
        return []
    return [
        pci / name
        for name in names
        if _read(os.path.join(pci, name, "vendor")).strip() == NVIDIA_VENDOR
        and _read(os.path.join(pci, name, "class")).startswith("0x03")
    ]


def absence_fingerprint() -> str | None:
    """Where the system shows no NVIDIA kernel module and no GPU device node: a hash of what
    could change that (see the module's doc); else None (no absence is remembered)."""
    selection = (*config.cuda_selection(), config.library_path())
    return _absence(PROC, SYS_MODULE, PCI, DEV, WSL_LIBRARIES, LINKER_CACHE, selection)


@functools.cache
def _absence(proc: Path, sys_module: Path, pci: Path, dev: Path, wsl: Path, linker: Path,
             selection: tuple[str | None, ...]) -> str | None:  # fmt: skip
    nodes = _listing(dev, ("nvidia", "dxg"))
    if _read(proc / "version") or _read(sys_module) or nodes:
        return None
    try:
        linked = str(linker.stat().st_mtime_ns)
    except OSError:
        linked = ""
    parts = [
        "no GPU",
        *(e.name for e in _nvidia_devices(pci)),
        *_listing(wsl, ("",)),
        linked,
        *map(repr, selection),
    ]
    return sha256("\0".join(parts).encode()).hexdigest()


def _listing(directory: Path, prefixes: tuple[str, ...]) -> list[str]:
    try:
        return sorted(name for name in os.listdir(directory) if name.startswith(prefixes))
    except OSError:
        return []


def remembered_absence() -> str | None:
    """Why the driver found no GPU here last time, where nothing has changed since."""
    found = absence_fingerprint()
    blob = None if found is None else default_cache().get("no-gpu", make_key("no-gpu", found))
    return None if blob is None else blob.decode(errors="replace")


def remember_absence(reason: str, lasting: bool = True) -> None:
    """Keep why the driver found no GPU, where that is ``lasting`` (not a busy device) and
    the system shows none either, as it is now that the driver was asked (asking may load
    the kernel module and make the device nodes)."""
    if not lasting:
        return
    _absence.cache_clear()
    found = absence_fingerprint()
    if found is not None and remembered_absence() != reason:
        default_cache().put("no-gpu", make_key("no-gpu", found), reason.encode())


def remembered() -> DeviceInfo | None:
    """The description the last context on this machine gave, if nothing has changed."""
    key = _key()
    blob = None if key is None else default_cache().get("device", key)
    if blob is None:
        return None
    try:
        fields = json.loads(blob)
        fields["compute_capability"] = tuple(fields["compute_capability"])
        return DeviceInfo(**fields)
    except (ValueError, TypeError, KeyError) as exc:
        log.info("dropping an unreadable device description: %s", exc)
        default_cache().drop("device", key)
        return None


def remember(info: DeviceInfo) -> None:
    """Keep what a context found (for ordinal 0, the device a run uses)."""
    key = _key()
    if key is None or remembered() == info:
        return
    default_cache().put("device", key, json.dumps(records.asdict(info)).encode())


def launched_last_time(wasm: bytes) -> bool | None:
    """Whether the last run of ``wasm`` on this machine launched on its GPU, or would have
    with the device started with it (None: no run of it is remembered, or the system does
    not describe its GPUs)."""
    key = _module_key(wasm)
    blob = None if key is None else default_cache().get("launched", key)
    return None if blob is None else blob == b"1"


def remember_launches(wasm: bytes, launched: bool) -> None:
    """Keep whether this run of ``wasm`` launched on the GPU (or would have, with the device
    started with it: :meth:`runtime.planning.ArrivalPlanner.start_would_pay`), for the next."""
    key = _module_key(wasm)
    if key is not None and launched_last_time(wasm) is not launched:
        default_cache().put("launched", key, b"1" if launched else b"0")


def _module_key(wasm: bytes) -> str | None:
    found = fingerprint()
    return None if found is None else make_key("launched", found, hexdigest(wasm))


def _key() -> str | None:
    found = fingerprint()
    return None if found is None else make_key("device", found)


def _read(path: Path | str) -> str:
    """The text of a small file the operating system describes itself in ("" where there is
    none), read without pathlib's layers (a warm start reads a dozen)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")
