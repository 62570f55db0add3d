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

Whether a module's last run launched anything is kept too: ``tensorwasm run`` makes the
context on a thread while it starts, which a run whose loops all stay on the CPU pays for
(importing the CUDA bindings on that thread holds Python's interpreter lock: ~0.2 s of a
0.5 s run on the H100 machine). Where the GPU is remembered and the module's last run here
launched nothing, no thread is started; should this run launch after all, its first launch
makes the context.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from dialect import logs, records
from dialect.digest import sha256
from runtime.cache import default_cache, make_key
from runtime.device_info import DeviceInfo

log = logs.get_logger(__name__)

# Where the operating system describes the driver and the devices (patched by the tests).
PROC = Path("/proc/driver/nvidia")
SYS_MODULE = Path("/sys/module/nvidia/version")
PCI = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"
SELECTION = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def fingerprint() -> str | None:
    """A hash of the driver's version and the NVIDIA devices, or None where the operating
    system does not say (then nothing is remembered). Read once per process and selection."""
    return _fingerprint(PROC, SYS_MODULE, PCI, tuple(os.environ.get(name) for name in SELECTION))


@functools.cache
def _fingerprint(proc: Path, sys_module: Path, pci: Path, selection: tuple[str | None, ...]) -> str | None:
    driver = _read(proc / "version") or _read(sys_module)
    if not driver:
        return None
    gpus = []
    try:
        entries = sorted(pci.iterdir())
    except OSError:
        return None
    for entry in entries:
        if _read(entry / "vendor").strip() != NVIDIA_VENDOR or not _read(entry / "class").startswith("0x03"):
            continue  # not an NVIDIA display or 3D controller
        gpus.append(
            f"{entry.name} {_read(entry / 'device').strip()} {_read(proc / 'gpus' / entry.name / 'information')}"
        )
    if not gpus:
        return None
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: it differs from one not set.
    parts = [driver, *gpus, *(f"{name}={value!r}" for name, value in zip(SELECTION, selection, strict=True))]
    return sha256("\0".join(parts).encode()).hexdigest()


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
    """Whether the last run of ``wasm`` on this machine launched on its GPU (None: no run of
    it is remembered, or the system does not describe its GPUs)."""
    key = _module_key(wasm)
    blob = None if key is None else default_cache().get("launched", key)
    return None if blob is None else blob == b"1"


def remember_launches(wasm: bytes, launched: bool) -> None:
    """Keep whether this run of ``wasm`` launched on the GPU, for the next one."""
    key = _module_key(wasm)
    if key is not None and launched_last_time(wasm) is not launched:
        default_cache().put("launched", key, b"1" if launched else b"0")


def _module_key(wasm: bytes) -> str | None:
    found = fingerprint()
    return None if found is None else make_key("launched", found, sha256(wasm).hexdigest())


def _key() -> str | None:
    found = fingerprint()
    return None if found is None else make_key("device", found)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
