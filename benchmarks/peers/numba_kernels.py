"""The suite's kernels written with ``numba.cuda.jit``: one thread per output element (a 2-D
or 3-D grid for the nests), inner loops sequential in the thread as in the C source;
reductions as in ``kernels.cu`` (grid-stride loop, shared-memory tree, one atomic per block).

Constants arrive as float32 arguments, so the arithmetic stays in f32 as in the C source.
Imported by :mod:`benchmarks.peers.numba_peer` only, in the numba-cuda peer's own process.
"""

from __future__ import annotations

import math

import numpy as np

# numba-cuda 0.30 still calls numpy.row_stack, which NumPy 2.5 removed (it was an alias of
# numpy.vstack): restore the alias before numba.cuda is imported, in this process only.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda

BLOCK = 256


@cuda.jit
def saxpy(n, a, x, y):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i] + y[i]


@cuda.jit
def condmap(n, x, y, two, quarter):
    i = cuda.grid(1)
    if i < n:
        if x[i] > 0:
            y[i] = math.sqrt(x[i]) * two
        else:
            y[i] = x[i] * x[i] - quarter


@cuda.jit
def dot(n, x, y, out):
    part = cuda.shared.array(BLOCK, np.float64)
    tid = cuda.threadIdx.x
    total = 0.0
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        total += x[i] * y[i]
    part[tid] = total
    cuda.syncthreads()
    half = BLOCK // 2
    while half > 0:
        if tid < half:
            part[tid] += part[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, part[0])


@cuda.jit
def reduce(n, x, total, bounds):
    psum = cuda.shared.array(BLOCK, np.int64)
    pmin = cuda.shared.array(BLOCK, np.int32)
    pmax = cuda.shared.array(BLOCK, np.int32)
    tid = cuda.threadIdx.x
    s = np.int64(0)
    lo = x[0]
    hi = x[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        s += x[i]
        lo = min(lo, x[i])
        hi = max(hi, x[i])
    psum[tid] = s
    pmin[tid] = lo
    pmax[tid] = hi
    cuda.syncthreads()
    half = BLOCK // 2
    while half > 0:
        if tid < half:
            psum[tid] += psum[tid + half]
            pmin[tid] = min(pmin[tid], pmin[tid + half])
            pmax[tid] = max(pmax[tid], pmax[tid + half])
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        cuda.atomic.add(total, 0, psum[0])
        cuda.atomic.min(bounds, 0, pmin[0])
        cuda.atomic.max(bounds, 1, pmax[0])


@cuda.jit
def gemv(n, a, x, y, zero):
    i = cuda.grid(1)
    if i < n:
        total = zero
        for j in range(n):
            total += a[i * n + j] * x[j]
        y[i] = total


@cuda.jit
def gemm(n, a, b, c, zero):
    j, i = cuda.grid(2)
    if i < n and j < n:
        total = zero
        for k in range(n):
            total += a[i * n + k] * b[k * n + j]
        c[i * n + j] = total


@cuda.jit
def stencil2d(n, a, b, fifth):
    j, i = cuda.grid(2)
    i += 1
    j += 1
    if i < n - 1 and j < n - 1:
        b[i * n + j] = fifth * (
            a[i * n + j] + a[(i - 1) * n + j] + a[(i + 1) * n + j] + a[i * n + j - 1] + a[i * n + j + 1]
        )


@cuda.jit
def stencil3d(n, a, b, seventh):
    z, y, x = cuda.grid(3)
    x += 1
    y += 1
    z += 1
    sx = n * n
    if x < n - 1 and y < n - 1 and z < n - 1:
        c = x * sx + y * n + z
        b[c] = seventh * (a[c] + a[c - sx] + a[c + sx] + a[c - n] + a[c + n] + a[c - 1] + a[c + 1])


KERNELS = {f.__name__: f for f in (saxpy, condmap, dot, reduce, gemv, gemm, stencil2d, stencil3d)}
