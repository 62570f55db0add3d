"""TensorWasm: WebAssembly compiled to NVIDIA PTX, run on the GPU bit for bit as Wasm defines.

``tensorwasm.instantiate(store, wasm, imports)`` is wasmtime's ``Instance`` for a module
whose parallel loops offload to the GPU (or to the host backend where there is none), and
``tensorwasm.report(instance)`` says where each loop ran (:mod:`tensorwasm.runtime.api`).

The parts are subpackages: ``tensorwasm.dialect`` (the typed SSA IR),
``tensorwasm.compiler`` (frontend, analyses, lowering, targets), ``tensorwasm.runtime``
(driver layer, offload, CLI), ``tensorwasm.oracle`` (differential testing against
wasmtime) and ``tensorwasm.support`` (errors, logging, records, digests, configuration).
"""

from __future__ import annotations

import os

# In a source checkout the subpackages are the repository's top-level folders (compiler/,
# runtime/, ...) beside this one; an installed tensorwasm holds them inside this folder.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "compiler")) and os.path.isfile(
    os.path.join(_checkout, "compiler", "__init__.py")
):
    __path__.append(_checkout)

__all__ = ["instantiate", "report"]


def __getattr__(name: str):
    if name in __all__:  # imported on first use: a plain `import tensorwasm` stays cheap
        from tensorwasm.runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'tensorwasm' has no attribute {name!r}")
