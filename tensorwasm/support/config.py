"""The configuration TensorWasm reads from the environment, in one place.

Each variable has one accessor here, which reads it when called (an embedder or a test
may change the environment between calls), parses it and checks it; a value it cannot
use is a :class:`~tensorwasm.support.errors.ConfigError` that names the variable and the
value. An unset variable and an empty one mean the same: the default.

- ``TENSORWASM_CACHE_DIR`` (:func:`cache_dir`): the compiled-code cache's directory
  (default ``$XDG_CACHE_HOME/tensorwasm``, else ``~/.cache/tensorwasm``);
- ``TENSORWASM_CACHE`` (:func:`cache_enabled`): ``on`` (the default) or ``off``: compile
  everything, keep nothing;
- ``TENSORWASM_DEVICE_MEMORY_LIMIT`` (:func:`device_memory_limit`): the bytes one
  instance's launches may hold on the device, with an optional ``K``, ``M`` or ``G``
  suffix (powers of 1024);
- ``TENSORWASM_PTXAS`` (:func:`ptxas`): the ptxas that assembles PTX before the driver
  loads it (a path, or a name on ``PATH``), or ``off``;
- ``TENSORWASM_PTX_BACKEND`` (:func:`ptx_backend`): the code generator that writes PTX:
  ``llvm`` (LLVM's NVPTX backend), ``nvvm`` (NVIDIA's libNVVM) or ``auto`` (the default:
  LLVM for now; a per-kernel choice needs GPU timings, see ``benchmarks.codegen``);
- ``TENSORWASM_TILING`` (:func:`tiling_enabled`): ``on`` (the default) or ``off``: gemm-shaped
  loop nests run as tiled kernels (shared-memory tiles, a block of cells per thread; see
  ``compiler.tile``), or as one thread per cell. Part of the prepared module's cache key.
- ``TENSORWASM_COMPILE`` (:func:`compile_mode`): when an offloaded loop's kernel is
  compiled: ``background`` (on worker threads, from the loop's first launch that pays,
  while wasmtime runs its arrivals until it is ready), ``sync`` (at its first launch,
  which waits for it) or ``auto`` (the default: background where offload weighs what a
  launch pays, ``tensorwasm run``'s auto mode; sync where every launch the guards allow is
  made);
- ``TENSORWASM_COMPILE_THREADS`` (:func:`compile_threads`): the worker threads that
  compile kernels in the background (default: 2, at most the processors there are).
- ``TENSORWASM_HOST_WHILE_STARTING`` (:func:`host_while_starting`): ``auto`` (the default),
  ``on`` or ``off``: in ``auto`` offload mode, a GPU module's launches that its device's
  start keeps from the GPU (a start that does not pay yet, or one under way) run on the
  host's threads where the host's cost model finds that faster than wasmtime
  (``runtime.while_starting``). ``auto`` leaves out the loops of device-resident regions: on
  the H100's 16-core host their time steps gained nothing measurable there and fdtd-2d's
  lost (docs/offload.md); ``on`` runs those too.

CUDA's own variables that decide which GPUs a process sees and which driver library it
loads (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``LD_LIBRARY_PATH``) are read here
too, as they are (CUDA parses them): :func:`cuda_selection`, :func:`library_path`. The
command line sets one where the environment does not: ``CUDA_DEVICE_MAX_CONNECTIONS``
(:func:`default_device_connections`).

Importing this module costs nothing a start of ``tensorwasm run`` does not already pay.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from tensorwasm.support.errors import ConfigError

CACHE_DIR = "TENSORWASM_CACHE_DIR"
CACHE = "TENSORWASM_CACHE"
DEVICE_MEMORY_LIMIT = "TENSORWASM_DEVICE_MEMORY_LIMIT"
PTXAS = "TENSORWASM_PTXAS"
PTX_BACKEND = "TENSORWASM_PTX_BACKEND"
TILING = "TENSORWASM_TILING"
COMPILE = "TENSORWASM_COMPILE"
COMPILE_THREADS = "TENSORWASM_COMPILE_THREADS"
HOST_WHILE_STARTING = "TENSORWASM_HOST_WHILE_STARTING"
#: When kernels compile (see :func:`compile_mode`).
COMPILE_MODES = ("auto", "background", "sync")
#: Which launches a GPU's start keeps from it run on the host (see :func:`host_while_starting`).
HOST_WHILE_STARTING_MODES = ("auto", "on", "off")
#: The code generators that write PTX (``auto`` chooses one of the others).
PTX_BACKENDS = ("llvm", "nvvm", "auto")
#: CUDA's variables that select and order the devices a process sees.
CUDA_SELECTION = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
LIBRARY_PATH = "LD_LIBRARY_PATH"
DEVICE_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _read(name: str) -> str | None:
    """The variable's value; None where it is unset or empty."""
    return os.environ.get(name) or None


def cache_dir() -> Path:
    """The cache's directory: ``$TENSORWASM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tensorwasm``,
    else ``~/.cache/tensorwasm``. A path that exists and is not a directory is refused."""
    explicit = _read(CACHE_DIR)
    if explicit is None:
        base = _read("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "tensorwasm"
    path = Path(explicit)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{CACHE_DIR}={explicit!r} is not a directory")
    return path


def cache_enabled() -> bool:
    """Whether compiled code is cached: ``TENSORWASM_CACHE`` is ``on`` (the default) or ``off``."""
    text = _read(CACHE)
    if text is None:
        return True
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"{CACHE}={text!r}: say on or off")
    return value == "on"


def tiling_enabled() -> bool:
    """Whether gemm-shaped nests are tiled: ``TENSORWASM_TILING`` is ``on`` (the default) or ``off``."""
    return _on_off(TILING, default=True)


def host_while_starting() -> str:
    """``TENSORWASM_HOST_WHILE_STARTING``: ``auto`` (the default), ``on`` or ``off``."""
    return _choice(HOST_WHILE_STARTING, HOST_WHILE_STARTING_MODES, "auto")


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The variable ``name``'s value, one of ``choices`` (any case, spaces around it), or
    ``default`` where it is not set."""
    text = _read(name)
    if text is None:
        return default
    value = text.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={text!r}: say {', '.join(choices[:-1])} or {choices[-1]}")
    return value


def _on_off(name: str, default: bool) -> bool:
    text = _read(name)
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"{name}={text!r}: say on or off")
    return value == "on"


def parse_size(text: str) -> int:
    """A size in bytes: ``"512M"`` -> 536870912, ``"2GiB"``, ``"1048576"``; suffixes are
    powers of 1024, in either case. Raises ValueError where ``text`` is not a size."""
    import re

    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size (e.g. 1073741824, 512M, 2G)")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def device_memory_limit() -> int | None:
    """The device memory one instance's launches may hold, from
    ``TENSORWASM_DEVICE_MEMORY_LIMIT``; None where it is not set (no cap but the device's)."""
    text = _read(DEVICE_MEMORY_LIMIT)
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError:
        raise ConfigError(
            f"{DEVICE_MEMORY_LIMIT}={text!r} is not a size (bytes, e.g. 1073741824, 512M, 2G)"
        ) from None


def ptxas() -> str | Literal[False] | None:
    """``TENSORWASM_PTXAS``: the ptxas to run (the value: a path, or a name on ``PATH``); False where it is ``off`` (the driver's JIT assembles every module);
    None where it is not set (a ptxas is looked for on ``PATH``, then in the pip package).
    A value that names no executable file is refused."""
    text = _read(PTXAS)
    if text is None:
        return None
    if text.strip().lower() == "off":
        return False
    import shutil

    found = shutil.which(text)
    if found is None:
        raise ConfigError(f"{PTXAS}={text!r} names no executable file (a ptxas, or off)")
    return text


def ptx_backend() -> str:
    """``TENSORWASM_PTX_BACKEND``: ``llvm``, ``nvvm`` or ``auto`` (the default)."""
    return _choice(PTX_BACKEND, PTX_BACKENDS, "auto")


def compile_mode() -> str:
    """``TENSORWASM_COMPILE``: ``auto`` (the default), ``background`` or ``sync``."""
    return _choice(COMPILE, COMPILE_MODES, "auto")


def compile_threads() -> int:
    """``TENSORWASM_COMPILE_THREADS``: a count from 1 to 64 (default: 2, or 1 on one processor)."""
    text = _read(COMPILE_THREADS)
    if text is None:
        return max(1, min(2, os.cpu_count() or 1))
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise ConfigError(f"{COMPILE_THREADS}={text!r}: say a count of threads from 1 to 64")
    return value


def cuda_selection() -> tuple[str | None, ...]:
    """The values of :data:`CUDA_SELECTION`, as they are (None: unset; an empty
    ``CUDA_VISIBLE_DEVICES`` hides every GPU, unlike an unset one)."""
    return tuple(os.environ.get(name) for name in CUDA_SELECTION)


def library_path() -> str | None:
    """``LD_LIBRARY_PATH`` as it is (None: unset), where the CUDA driver library may be found."""
    return os.environ.get(LIBRARY_PATH)


def default_device_connections(count: int) -> None:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` (the hardware work queues of each CUDA context the
    driver makes from then on) set to ``count``, unless the environment sets it."""
    os.environ.setdefault(DEVICE_CONNECTIONS, str(count))
