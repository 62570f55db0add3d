"""SHA-256 digests without OpenSSL (tensorwasm/support/digest.py): the same as hashlib's, and
a module's hex digest computed once however many keys name it."""

from __future__ import annotations

import hashlib

from tensorwasm.support import digest


def test_the_digests_are_hashlibs() -> None:
    for data in (b"", b"\0asm\1\0\0\0", bytes(range(256)) * 600):
        assert digest.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
        assert digest.hexdigest(data) == hashlib.sha256(data).hexdigest()
        assert (
            digest.hexdigest(bytearray(data)) == digest.hexdigest(memoryview(data)) == digest.hexdigest(data)
        )


def test_a_module_hashed_again_is_not_hashed_again(monkeypatch) -> None:
    module = bytes(range(256)) * 600  # (150 KiB, PolyBench's size)
    first = digest.hexdigest(module)
    monkeypatch.setattr(digest, "sha256", lambda data: (_ for _ in ()).throw(AssertionError("hashed again")))
    assert digest.hexdigest(module) == first
    assert digest.hexdigest(bytes(module)) == first  # (an equal module, however it was read)
