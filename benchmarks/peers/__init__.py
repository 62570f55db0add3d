"""Peers of TensorWasm's offloaded loops: the same kernels in CUDA C (nvcc), numba-cuda and
CuPy, and the device's copy bandwidth, each run in a process of its own by the runner
(``python -m benchmarks``) through ``python -m benchmarks.peers FAMILY``.

A family is imported only in its own process, so a library that is missing or broken, or a
fault that poisons a CUDA context, costs that family alone.
"""

from __future__ import annotations

#: Family name -> "module:factory" (a Peer class), or the copy measurements.
FAMILIES = {
    "copy": "benchmarks.peers.bandwidth:measure",
    "nvcc": "benchmarks.peers.cuda_c:CudaC",
    "numba-cuda": "benchmarks.peers.numba_peer:NumbaCuda",
    "cupy": "benchmarks.peers.cupy_ops:CuPy",
}
#: The families whose kernels are compared with TensorWasm's.
KERNEL_PEERS = ("nvcc", "numba-cuda", "cupy")
