"""SHA-256 without OpenSSL: :mod:`hashlib` loads OpenSSL's library when it is imported
(~3 ms), which a warm start of ``tensorwasm run`` hashing a few kilobytes for its cache
keys does not need. CPython's own SHA-256 gives the same digests."""

from __future__ import annotations

try:
    from _sha256 import sha256  # CPython 3.11
except ImportError:
    try:
        from _sha2 import sha256  # CPython 3.12 and later
    except ImportError:  # another Python: hashlib's
        from hashlib import sha256

__all__ = ["sha256"]
