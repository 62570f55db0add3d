"""Loggers that import :mod:`logging` only when a message is to be written.

Importing :mod:`logging` (with :mod:`traceback`, :mod:`tokenize` and :mod:`string` behind
it) costs a start of ``tensorwasm run`` ~2.5 ms, and a warm run whose loops all stay on
the CPU writes no message at all. ``log = get_logger(__name__)`` gives a stand-in for
``logging.getLogger(__name__)``: while nothing has imported :mod:`logging`, a message
below the level :func:`configure` set (``WARNING`` by default, as Python's last-resort
handler writes) is dropped at once; any other message imports it, applies the
configuration :func:`configure` deferred, and goes to the real logger. Once something has
imported :mod:`logging` (an application, the tests' log capture), every message goes to
the real logger, which decides as it always does.
"""

from __future__ import annotations

import sys
from typing import Any

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40

_threshold = WARNING  # while logging is not imported: messages below this are dropped
_deferred: dict[str, Any] | None = None  # logging.basicConfig's arguments, not yet applied


def configure(level: int, format: str) -> None:
    """``logging.basicConfig(level=level, format=format)``, applied now if :mod:`logging` is
    imported, else when the first message at ``level`` or above is written."""
    global _threshold, _deferred
    _threshold = level
    _deferred = {"level": level, "format": format}
    if "logging" in sys.modules:
        _logging()


def _logging():
    """:mod:`logging`, imported, with the deferred configuration applied."""
    global _deferred
    import logging

    if _deferred is not None:
        config, _deferred = _deferred, None
        logging.basicConfig(**config)
    return logging


class Logger:
    """A stand-in for the :class:`logging.Logger` named ``name`` (see the module)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: int, msg: str, args: tuple, kwargs: dict[str, Any]) -> None:
        if "logging" not in sys.modules and level < _threshold:
            return
        # The record names the caller of log/debug/info/..., not this stand-in.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
        _logging().getLogger(self.name).log(level, msg, *args, **kwargs)

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(level, msg, args, kwargs)

    def isEnabledFor(self, level: int) -> bool:
        if "logging" not in sys.modules:
            return level >= _threshold
        return _logging().getLogger(self.name).isEnabledFor(level)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(DEBUG, msg, args, kwargs)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(INFO, msg, args, kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(WARNING, msg, args, kwargs)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(ERROR, msg, args, kwargs)

    def exception(self, msg: str, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exc_info", True)
        self._emit(ERROR, msg, args, kwargs)


def get_logger(name: str) -> Logger:
    """The stand-in for ``logging.getLogger(name)``."""
    return Logger(name)
