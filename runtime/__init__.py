"""The runtime: ``runtime.instantiate(store, wasm, imports)``, wasmtime's ``Instance`` for a
module whose parallel loops offload, and ``runtime.report(instance)`` (:mod:`runtime.api`)."""


def __getattr__(name: str):
    if name in ("instantiate", "report"):  # imported on first use: the runtime is large
        from runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
