(module
  (type $t0 (func (param i32 i32) (result i32)))
  (type $t1 (func (param i64) (result i64)))
  (type $t2 (func (param f64 i32) (result f64)))
  (type $t3 (func (param f32 i64) (result f32)))
  (memory (export "memory") 1 1)
  (global $g0 (export "g0") (mut i32) (i32.const 0))
  (global $g1 (export "g1") (mut i64) (i64.const 0))
  (global $g2 (export "g2") (mut f32) (f32.const 0x0.0p+0))
  (global $g3 (export "g3") (mut f64) (f64.const 0x0.0p+0))
  (data (i32.const 0) "")
  (table $tab (export "table") 1 funcref)
  (elem (table $tab) (i32.const 0) funcref (ref.null func))
  (func $f0 (export "f0") (type $t0) (param $p0 i32) (param $p1 i32) (result i32)
    (local $a0 i32) (local $a1 i32) (local $b0 i64) (local $b1 i64) (local $c0 f32) (local $c1 f32) (local $d0 f64) (local $d1 f64) (local $k0 i32) (local $k1 i32) (local $cf32 f32) (local $cf64 f64)
    i32.const 0
    i32.const 65535
    i32.and
    i32.const 1
    i32.const 17
    memory.fill
    i32.const 0
    i32.const 65535
    i32.and
    i32.const 8
    i32.const 17
    memory.copy
    i32.const 0)
)
