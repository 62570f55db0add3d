/*
 * wasi_cuda.h: the wasi:cuda guest API, for C programs built for wasm32
 * (clang --target=wasm32-wasi or --target=wasm32). See docs/wasi-cuda.md.
 *
 * A guest loads PTX it carries itself, allocates device buffers, copies to and
 * from them and launches kernels. Every function returns an int32_t: >= 0 on
 * success (a handle, a length, or WASI_CUDA_OK), a negative WASI_CUDA_ERR_*
 * code on failure; wasi_cuda_last_error() then says what went wrong.
 * Handles are positive and belong to the instance that made them. The guest
 * never sees a device address: kernel pointer arguments are (buffer handle,
 * byte offset) records, made with wasi_cuda_arg_buffer().
 *
 * The module must export its linear memory as "memory" (clang does).
 */
#ifndef WASI_CUDA_H
#define WASI_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define WASI_CUDA_OK 0
#define WASI_CUDA_ERR_NO_GPU (-1)           /* no usable GPU; last_error says why */
#define WASI_CUDA_ERR_BAD_POINTER (-2)      /* pointer + length outside linear memory */
#define WASI_CUDA_ERR_BAD_HANDLE (-3)       /* not a live handle of this instance (or wrong kind) */
#define WASI_CUDA_ERR_BAD_ARGUMENT (-4)     /* bad value, record, argument count/size, raw address */
#define WASI_CUDA_ERR_BAD_RANGE (-5)        /* copy or pointer argument past the buffer's end */
#define WASI_CUDA_ERR_BAD_LAUNCH (-6)       /* grid/block/shared size past device or kernel limits */
#define WASI_CUDA_ERR_OUT_OF_MEMORY (-7)    /* over the instance's cap, or device out of memory */
#define WASI_CUDA_ERR_NOT_FOUND (-8)        /* no kernel of that name in the module */
#define WASI_CUDA_ERR_MODULE_LOAD (-9)      /* the JIT rejected the PTX (log in last_error) */
#define WASI_CUDA_ERR_DRIVER (-10)          /* another driver error; the GPU is still usable */
#define WASI_CUDA_ERR_FAULTED (-11)         /* a sticky fault: no GPU call can succeed any more */
#define WASI_CUDA_ERR_TOO_MANY_HANDLES (-12) /* too many live handles in this instance */
#define WASI_CUDA_ERR_INTERNAL (-13)        /* a bug in the host */

/* Kernel argument records: 16 bytes, little-endian. */
#define WASI_CUDA_ARG_I32 1    /* payload: the value in its low 4 bytes */
#define WASI_CUDA_ARG_I64 2    /* payload: the value */
#define WASI_CUDA_ARG_F32 3    /* payload: the float's bits in its low 4 bytes */
#define WASI_CUDA_ARG_F64 4    /* payload: the double's bits */
#define WASI_CUDA_ARG_BUFFER 5 /* buffer: the handle; payload: byte offset into it */

typedef struct wasi_cuda_arg {
    uint32_t tag;     /* WASI_CUDA_ARG_* */
    uint32_t buffer;  /* buffer handle for WASI_CUDA_ARG_BUFFER, else 0 */
    uint64_t payload; /* value bits, or the byte offset into the buffer */
} wasi_cuda_arg;

_Static_assert(sizeof(wasi_cuda_arg) == 16, "a wasi_cuda_arg record is 16 bytes");

#define WASI_CUDA_IMPORT(name) __attribute__((import_module("wasi:cuda"), import_name(#name)))

/* Modules and kernels. */
WASI_CUDA_IMPORT(module_load)
int32_t wasi_cuda_module_load(const char *ptx, uint32_t ptx_len);
WASI_CUDA_IMPORT(module_unload)
int32_t wasi_cuda_module_unload(int32_t module);
WASI_CUDA_IMPORT(module_get_function)
int32_t wasi_cuda_module_get_function(int32_t module, const char *name, uint32_t name_len);

/* Device memory. */
WASI_CUDA_IMPORT(mem_alloc)
int32_t wasi_cuda_mem_alloc(uint64_t size);
WASI_CUDA_IMPORT(mem_free)
int32_t wasi_cuda_mem_free(int32_t buffer);
WASI_CUDA_IMPORT(memcpy_htod)
int32_t wasi_cuda_memcpy_htod(int32_t dst, uint64_t dst_offset, const void *src, uint32_t len);
WASI_CUDA_IMPORT(memcpy_dtoh)
int32_t wasi_cuda_memcpy_dtoh(void *dst, int32_t src, uint64_t src_offset, uint32_t len);

/* Launch (asynchronous) and wait. */
WASI_CUDA_IMPORT(launch)
int32_t wasi_cuda_launch(int32_t function, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                         uint32_t block_x, uint32_t block_y, uint32_t block_z,
                         uint32_t shared_bytes, const wasi_cuda_arg *args, uint32_t nargs);
WASI_CUDA_IMPORT(synchronize)
int32_t wasi_cuda_synchronize(void);

/* The last failed call's message: copies at most buf_len bytes (no NUL added)
 * and returns the message's full length; 0 when the last call succeeded. */
WASI_CUDA_IMPORT(last_error)
int32_t wasi_cuda_last_error(char *buf, uint32_t buf_len);

/* Argument records. */
static inline wasi_cuda_arg wasi_cuda_arg_i32(int32_t value) {
    wasi_cuda_arg arg = {WASI_CUDA_ARG_I32, 0, (uint32_t)value};
    return arg;
}

static inline wasi_cuda_arg wasi_cuda_arg_i64(int64_t value) {
    wasi_cuda_arg arg = {WASI_CUDA_ARG_I64, 0, (uint64_t)value};
    return arg;
}

static inline wasi_cuda_arg wasi_cuda_arg_f32(float value) {
    uint32_t bits;
    __builtin_memcpy(&bits, &value, sizeof bits);
    wasi_cuda_arg arg = {WASI_CUDA_ARG_F32, 0, bits};
    return arg;
}

static inline wasi_cuda_arg wasi_cuda_arg_f64(double value) {
    uint64_t bits;
    __builtin_memcpy(&bits, &value, sizeof bits);
    wasi_cuda_arg arg = {WASI_CUDA_ARG_F64, 0, bits};
    return arg;
}

static inline wasi_cuda_arg wasi_cuda_arg_buffer(int32_t buffer, uint64_t offset) {
    wasi_cuda_arg arg = {WASI_CUDA_ARG_BUFFER, (uint32_t)buffer, offset};
    return arg;
}

#ifdef __cplusplus
}
#endif

#endif /* WASI_CUDA_H */
