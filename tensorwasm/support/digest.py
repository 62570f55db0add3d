"""SHA-256 without OpenSSL: :mod:`hashlib` loads OpenSSL's library when it is imported
(~3 ms), which a warm start of ``tensorwasm run`` hashing a few kilobytes for its cache
keys does not need. CPython's own SHA-256 gives the same digests."""

from __future__ import annotations

from functools import lru_cache

try:
    from _sha256 import sha256  # CPython 3.11
except ImportError:
    try:
        from _sha2 import sha256  # CPython 3.12 and later
    except ImportError:  # another Python: hashlib's
        from hashlib import sha256

__all__ = ["hexdigest", "sha256"]


@lru_cache(maxsize=8)
def _hexdigest(data: bytes) -> str:
    return sha256(data).hexdigest()


def hexdigest(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 of ``data`` in hex, computed once per module a process hashes again: a
    run's keys (its preparation, what its last run launched, whether to start the GPU) all
    name its module, ~1 ms a hash of PolyBench's 146 KiB gemver on the H100 machine's host."""
    return _hexdigest(data) if type(data) is bytes else sha256(data).hexdigest()
