"""The exception hierarchy shared by every TensorWasm layer.

Every error the project raises on purpose derives from :class:`TensorWasmError`, so
the CLI can turn any of them into one line and an exit status, and a traceback that
reaches a user always means a bug.
"""

from __future__ import annotations


class TensorWasmError(Exception):
    """Base class of every error TensorWasm raises deliberately."""


class IRTypeError(TensorWasmError):
    """An operation was built with operands of the wrong types."""


class VerifyError(TensorWasmError):
    """A dialect function breaks an invariant (types, dominance, terminators)."""


class ConfigError(TensorWasmError):
    """An environment variable holds a value TensorWasm cannot use (the message names both)."""
