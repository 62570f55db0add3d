/*
 * vadd.c: a WASI program that ships its own PTX and runs it on the GPU through
 * the wasi:cuda API (wasi_cuda.h, docs/wasi-cuda.md).
 *
 *   usage: vadd [n]      (default n = 1048576, 1 <= n <= 67108864)
 *
 * Fills a[i] = i * 0.25 + 1 and b[i] = (n - i) * 1.5 + 0.5 in floats, computes
 * c = a + b with the kernel below and compares c, bit for bit, with the sums
 * computed here. Prints "vadd n=N ok" and exits 0 when all match; exits 1 on a
 * mismatch or a failed call, and 2 when there is no GPU.
 *
 * Built (the .wasm next to this file is committed):
 *   clang-16 --target=wasm32-wasi --sysroot=/usr -std=c11 -Wall -Wextra -O2 -c vadd.c -o vadd.o
 *   clang-16 --target=wasm32-wasi --sysroot=/usr -Wl,--strip-debug vadd.o -o vadd.wasm
 * Run:
 *   tensorwasm run examples/cuda/vadd.wasm 100000
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasi_cuda.h"

/* c[i] = a[i] + b[i] for i < n; add.rn.f32 is IEEE single addition, like C's. */
static const char VADD_PTX[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vadd(\n"
    "    .param .u64 vadd_a,\n"
    "    .param .u64 vadd_b,\n"
    "    .param .u64 vadd_c,\n"
    "    .param .u32 vadd_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .f32 %f<4>;\n"
    "    .reg .b64 %rd<8>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vadd_a];\n"
    "    ld.param.u64 %rd2, [vadd_b];\n"
    "    ld.param.u64 %rd3, [vadd_c];\n"
    "    ld.param.u32 %r1, [vadd_n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra DONE;\n"
    "    mul.wide.u32 %rd4, %r5, 4;\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    cvta.to.global.u64 %rd2, %rd2;\n"
    "    cvta.to.global.u64 %rd3, %rd3;\n"
    "    add.s64 %rd5, %rd1, %rd4;\n"
    "    add.s64 %rd6, %rd2, %rd4;\n"
    "    add.s64 %rd7, %rd3, %rd4;\n"
    "    ld.global.f32 %f1, [%rd5];\n"
    "    ld.global.f32 %f2, [%rd6];\n"
    "    add.rn.f32 %f3, %f1, %f2;\n"
    "    st.global.f32 [%rd7], %f3;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

enum { BLOCK = 256, MAX_N = 1 << 26 };

static int failed(const char *call, int32_t status) {
    char message[2048];
    int32_t length = wasi_cuda_last_error(message, sizeof message - 1);
    if (length < 0) {
        length = 0;
    } else if (length > (int32_t)sizeof message - 1) {
        length = (int32_t)sizeof message - 1;
    }
    message[length] = '\0';
    if (status == WASI_CUDA_ERR_NO_GPU) {
        fprintf(stderr, "vadd: no GPU: %s\n", message);
        return 2;
    }
    fprintf(stderr, "vadd: %s failed with status %d: %s\n", call, (int)status, message);
    return 1;
}

#define CHECK(call, expr)                    \
    do {                                     \
        int32_t rc_ = (expr);                \
        if (rc_ < 0) return failed(call, rc_); \
    } while (0)

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1L << 20;
    if (n < 1 || n > MAX_N) {
        fprintf(stderr, "usage: vadd [n], 1 <= n <= %d\n", MAX_N);
        return 1;
    }
    uint32_t bytes = (uint32_t)n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    if (!a || !b || !c) {
        fprintf(stderr, "vadd: out of memory\n");
        return 1;
    }
    for (long i = 0; i < n; i++) {
        a[i] = (float)i * 0.25f + 1.0f;
        b[i] = (float)(n - i) * 1.5f + 0.5f;
    }
    memset(c, 0xff, bytes); /* NaNs, which the kernel must overwrite */

    int32_t module = wasi_cuda_module_load(VADD_PTX, sizeof VADD_PTX - 1);
    CHECK("module_load", module);
    int32_t kernel = wasi_cuda_module_get_function(module, "vadd", 4);
    CHECK("module_get_function", kernel);
    int32_t da = wasi_cuda_mem_alloc(bytes);
    CHECK("mem_alloc", da);
    int32_t db = wasi_cuda_mem_alloc(bytes);
    CHECK("mem_alloc", db);
    int32_t dc = wasi_cuda_mem_alloc(bytes);
    CHECK("mem_alloc", dc);
    CHECK("memcpy_htod", wasi_cuda_memcpy_htod(da, 0, a, bytes));
    CHECK("memcpy_htod", wasi_cuda_memcpy_htod(db, 0, b, bytes));
    CHECK("memcpy_htod", wasi_cuda_memcpy_htod(dc, 0, c, bytes));

    wasi_cuda_arg args[] = {
        wasi_cuda_arg_buffer(da, 0),
        wasi_cuda_arg_buffer(db, 0),
        wasi_cuda_arg_buffer(dc, 0),
        wasi_cuda_arg_i32((int32_t)n),
    };
    uint32_t blocks = (uint32_t)((n + BLOCK - 1) / BLOCK);
    CHECK("launch", wasi_cuda_launch(kernel, blocks, 1, 1, BLOCK, 1, 1, 0, args, 4));
    CHECK("synchronize", wasi_cuda_synchronize());
    CHECK("memcpy_dtoh", wasi_cuda_memcpy_dtoh(c, dc, 0, bytes));

    long mismatches = 0;
    for (long i = 0; i < n; i++) {
        float want = a[i] + b[i];
        if (memcmp(&c[i], &want, sizeof want) != 0) {
            if (mismatches < 5) {
                fprintf(stderr, "vadd: c[%ld] = %a, want %a\n", i, (double)c[i], (double)want);
            }
            mismatches++;
        }
    }
    CHECK("mem_free", wasi_cuda_mem_free(da));
    CHECK("mem_free", wasi_cuda_mem_free(db));
    CHECK("mem_free", wasi_cuda_mem_free(dc));
    CHECK("module_unload", wasi_cuda_module_unload(module));
    free(a);
    free(b);
    free(c);
    if (mismatches) {
        printf("vadd n=%ld mismatches=%ld\n", n, mismatches);
        return 1;
    }
    printf("vadd n=%ld ok\n", n);
    return 0;
}
