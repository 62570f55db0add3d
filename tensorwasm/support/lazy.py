"""Modules loaded at their first use, for libraries that a warm start may never need.

``name = LazyModule("package.module", globals(), "name")`` binds a stand-in; the first
attribute read through it imports the module and rebinds ``name`` in the importing
module's namespace to the module itself, so later reads there cost nothing extra.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    __slots__ = ("_lazy_alias", "_lazy_name", "_lazy_namespace")

    def __init__(self, name: str, namespace: dict[str, Any], alias: str) -> None:
        self._lazy_name = name
        self._lazy_namespace = namespace
        self._lazy_alias = alias

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._lazy_name)
        self._lazy_namespace[self._lazy_alias] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self._lazy_name}, imported at first use>"
