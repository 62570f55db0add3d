"""The runtime: the CUDA driver layer, instance state, whole-function executors, auto-offload
on wasmtime and the command line. Its public calls are ``tensorwasm.instantiate`` and
``tensorwasm.report`` (:mod:`tensorwasm.runtime.api`)."""
