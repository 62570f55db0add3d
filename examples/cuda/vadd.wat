;; vadd.wat: a guest that ships its own PTX and runs it through the wasi:cuda API.
;;
;; run(n) fills a[i] = i * 0.25 + 1 and b[i] = (n - i) * 1.5 + 0.5 (f32, 1 <= n <= 16384),
;; loads the vector-add kernel below, copies a and b to the device, launches one thread per
;; element, copies c back and compares it, bit for bit, with a + b computed by Wasm's own
;; f32.add. It returns the number of elements that differ (0: all equal), the negative
;; wasi:cuda status of the first call that failed (WASI_CUDA_ERR_NO_GPU = -1 without a
;; GPU), or -1000 when n is out of range. Run it with:
;;     tensorwasm run examples/cuda/vadd.wat --invoke run 1000
(module
  (import "wasi:cuda" "module_load" (func $module_load (param i32 i32) (result i32)))
  (import "wasi:cuda" "module_unload" (func $module_unload (param i32) (result i32)))
  (import "wasi:cuda" "module_get_function"
    (func $module_get_function (param i32 i32 i32) (result i32)))
  (import "wasi:cuda" "mem_alloc" (func $mem_alloc (param i64) (result i32)))
  (import "wasi:cuda" "mem_free" (func $mem_free (param i32) (result i32)))
  (import "wasi:cuda" "memcpy_htod" (func $memcpy_htod (param i32 i64 i32 i32) (result i32)))
  (import "wasi:cuda" "memcpy_dtoh" (func $memcpy_dtoh (param i32 i32 i64 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "synchronize" (func $synchronize (result i32)))

  ;; 0x100: kernel argument records; 0x200: the kernel's name; 0x400: the PTX (NUL-ended);
  ;; 0x10000, 0x20000, 0x30000: the arrays a, b and c (64 KiB each).
  (memory (export "memory") 4)
  (global $ARGS i32 (i32.const 0x100))
  (global $NAME i32 (i32.const 0x200))
  (global $PTX i32 (i32.const 0x400))
  (global $A i32 (i32.const 0x10000))
  (global $B i32 (i32.const 0x20000))
  (global $C i32 (i32.const 0x30000))
  (global $MAX_N i32 (i32.const 16384))
  (global $BLOCK i32 (i32.const 256))
  ;; argument record tags (wasi_cuda.h: WASI_CUDA_ARG_*)
  (global $ARG_I32 i32 (i32.const 1))
  (global $ARG_BUFFER i32 (i32.const 5))

  (data (i32.const 0x200) "vadd")
  ;; c[i] = a[i] + b[i] for i < n; add.rn.f32 is IEEE single addition, as Wasm's f32.add.
  (data (i32.const 0x400)
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
    "}\n"
    "\00")

  (func $strlen (param $p i32) (result i32)
    (local $q i32)
    (local.set $q (local.get $p))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (i32.load8_u (local.get $q))))
        (local.set $q (i32.add (local.get $q) (i32.const 1)))
        (br $next)))
    (i32.sub (local.get $q) (local.get $p)))

  ;; One 16-byte argument record: tag (u32), buffer handle (u32), payload (u64).
  (func $arg (param $index i32) (param $tag i32) (param $handle i32) (param $payload i64)
    (local $at i32)
    (local.set $at (i32.add (global.get $ARGS) (i32.shl (local.get $index) (i32.const 4))))
    (i32.store (local.get $at) (local.get $tag))
    (i32.store offset=4 (local.get $at) (local.get $handle))
    (i64.store offset=8 (local.get $at) (local.get $payload)))

  (func (export "run") (param $n i32) (result i32)
    (local $i i32) (local $bytes i32) (local $rc i32) (local $bad i32)
    (local $module i32) (local $kernel i32) (local $a i32) (local $b i32) (local $c i32)
    (if (i32.or (i32.lt_s (local.get $n) (i32.const 1))
                (i32.gt_s (local.get $n) (global.get $MAX_N)))
      (then (return (i32.const -1000))))
    (local.set $bytes (i32.shl (local.get $n) (i32.const 2)))

    ;; inputs, and a NaN pattern in c that the kernel must overwrite
    (local.set $i (i32.const 0))
    (loop $fill
      (f32.store (i32.add (global.get $A) (i32.shl (local.get $i) (i32.const 2)))
        (f32.add (f32.mul (f32.convert_i32_s (local.get $i)) (f32.const 0.25)) (f32.const 1)))
      (f32.store (i32.add (global.get $B) (i32.shl (local.get $i) (i32.const 2)))
        (f32.add (f32.mul (f32.convert_i32_s (i32.sub (local.get $n) (local.get $i)))
                          (f32.const 1.5))
                 (f32.const 0.5)))
      (i32.store (i32.add (global.get $C) (i32.shl (local.get $i) (i32.const 2))) (i32.const -1))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $fill (i32.lt_u (local.get $i) (local.get $n))))

    (local.set $module (call $module_load (global.get $PTX) (call $strlen (global.get $PTX))))
    (if (i32.lt_s (local.get $module) (i32.const 0)) (then (return (local.get $module))))
    (local.set $kernel (call $module_get_function (local.get $module) (global.get $NAME) (i32.const 4)))
    (if (i32.lt_s (local.get $kernel) (i32.const 0)) (then (return (local.get $kernel))))
    (local.set $a (call $mem_alloc (i64.extend_i32_u (local.get $bytes))))
    (if (i32.lt_s (local.get $a) (i32.const 0)) (then (return (local.get $a))))
    (local.set $b (call $mem_alloc (i64.extend_i32_u (local.get $bytes))))
    (if (i32.lt_s (local.get $b) (i32.const 0)) (then (return (local.get $b))))
    (local.set $c (call $mem_alloc (i64.extend_i32_u (local.get $bytes))))
    (if (i32.lt_s (local.get $c) (i32.const 0)) (then (return (local.get $c))))

    (local.set $rc (call $memcpy_htod (local.get $a) (i64.const 0) (global.get $A) (local.get $bytes)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $memcpy_htod (local.get $b) (i64.const 0) (global.get $B) (local.get $bytes)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $memcpy_htod (local.get $c) (i64.const 0) (global.get $C) (local.get $bytes)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))

    ;; vadd(a, b, c, n): three buffers (handle, offset 0) and an i32
    (call $arg (i32.const 0) (global.get $ARG_BUFFER) (local.get $a) (i64.const 0))
    (call $arg (i32.const 1) (global.get $ARG_BUFFER) (local.get $b) (i64.const 0))
    (call $arg (i32.const 2) (global.get $ARG_BUFFER) (local.get $c) (i64.const 0))
    (call $arg (i32.const 3) (global.get $ARG_I32) (i32.const 0) (i64.extend_i32_u (local.get $n)))
    (local.set $rc
      (call $launch (local.get $kernel)
        (i32.div_u (i32.add (local.get $n) (i32.sub (global.get $BLOCK) (i32.const 1))) (global.get $BLOCK))
        (i32.const 1) (i32.const 1)
        (global.get $BLOCK) (i32.const 1) (i32.const 1)
        (i32.const 0) (global.get $ARGS) (i32.const 4)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $synchronize))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $memcpy_dtoh (global.get $C) (local.get $c) (i64.const 0) (local.get $bytes)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))

    (local.set $i (i32.const 0))
    (loop $compare
      (local.set $bad
        (i32.add (local.get $bad)
          (i32.ne
            (i32.load (i32.add (global.get $C) (i32.shl (local.get $i) (i32.const 2))))
            (i32.reinterpret_f32
              (f32.add (f32.load (i32.add (global.get $A) (i32.shl (local.get $i) (i32.const 2))))
                       (f32.load (i32.add (global.get $B) (i32.shl (local.get $i) (i32.const 2)))))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $compare (i32.lt_u (local.get $i) (local.get $n))))

    (local.set $rc (call $mem_free (local.get $a)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $mem_free (local.get $b)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $mem_free (local.get $c)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.set $rc (call $module_unload (local.get $module)))
    (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (local.get $rc))))
    (local.get $bad))
)
