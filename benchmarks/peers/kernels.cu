// The suite's kernel functions as hand-written naive CUDA C: the same loops, one thread
// per output element (a 2-D or 3-D grid for the nests), inner loops sequential in the
// thread in the same order as the C source. Reductions take the usual hand-written form:
// a grid-stride loop per thread, a shared-memory tree over the block, one atomic per block.
//
// Compiled by benchmarks/peers/cuda_c.py with nvcc -O3 -fmad=false, so float results are
// rounded as Wasm rounds them (no fused multiply-add); the outputs then equal the Wasm
// programs' bit for bit.

#define BLOCK 256

extern "C" __global__ void saxpy(int n, float a, const float *__restrict__ x, float *__restrict__ y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void condmap(int n, const float *__restrict__ x, float *__restrict__ y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    if (x[i] > 0.0f)
      y[i] = sqrtf(x[i]) * 2.0f;
    else
      y[i] = x[i] * x[i] - 0.25f;
  }
}

// Launched with BLOCK threads per block; *out starts at 0.
extern "C" __global__ void dot(int n, const double *__restrict__ x, const double *__restrict__ y,
                               double *out) {
  __shared__ double part[BLOCK];
  double sum = 0.0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    sum += x[i] * y[i];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int half = BLOCK / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

// Launched with BLOCK threads per block; the outputs start at 0, INT_MAX and INT_MIN.
extern "C" __global__ void reduce(int n, const int *__restrict__ x, long long *out_sum, int *out_min,
                                  int *out_max) {
  __shared__ long long psum[BLOCK];
  __shared__ int pmin[BLOCK], pmax[BLOCK];
  long long s = 0;
  int lo = x[0], hi = x[0];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    s += x[i];
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  psum[threadIdx.x] = s;
  pmin[threadIdx.x] = lo;
  pmax[threadIdx.x] = hi;
  __syncthreads();
  for (int half = BLOCK / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      psum[threadIdx.x] += psum[threadIdx.x + half];
      pmin[threadIdx.x] = min(pmin[threadIdx.x], pmin[threadIdx.x + half]);
      pmax[threadIdx.x] = max(pmax[threadIdx.x], pmax[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd((unsigned long long *)out_sum, (unsigned long long)psum[0]);
    atomicMin(out_min, pmin[0]);
    atomicMax(out_max, pmax[0]);
  }
}

extern "C" __global__ void gemv(int n, const float *__restrict__ a, const float *__restrict__ x,
                                float *__restrict__ y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += a[i * n + j] * x[j];
    y[i] = sum;
  }
}

// Grid: x over columns j, y over rows i.
extern "C" __global__ void gemm(int n, const float *__restrict__ a, const float *__restrict__ b,
                                float *__restrict__ c) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  if (i < n && j < n) {
    float sum = 0.0f;
    for (int k = 0; k < n; k++) sum += a[i * n + k] * b[k * n + j];
    c[i * n + j] = sum;
  }
}

// One time step; grid: x over j, y over i, both over the interior.
extern "C" __global__ void stencil2d(int n, const float *__restrict__ a, float *__restrict__ b) {
  int j = blockIdx.x * blockDim.x + threadIdx.x + 1;
  int i = blockIdx.y * blockDim.y + threadIdx.y + 1;
  if (i < n - 1 && j < n - 1)
    b[i * n + j] = 0.2f * (a[i * n + j] + a[(i - 1) * n + j] + a[(i + 1) * n + j] + a[i * n + j - 1] +
                           a[i * n + j + 1]);
}

// One time step; grid: x over z, y over y, z over x, all over the interior.
extern "C" __global__ void stencil3d(int n, const float *__restrict__ a, float *__restrict__ b) {
  int z = blockIdx.x * blockDim.x + threadIdx.x + 1;
  int y = blockIdx.y * blockDim.y + threadIdx.y + 1;
  int x = blockIdx.z * blockDim.z + threadIdx.z + 1;
  int sx = n * n, sy = n;
  if (x < n - 1 && y < n - 1 && z < n - 1) {
    int c = x * sx + y * sy + z;
    b[c] = (1.0f / 7.0f) * (a[c] + a[c - sx] + a[c + sx] + a[c - sy] + a[c + sy] + a[c - 1] + a[c + 1]);
  }
}
