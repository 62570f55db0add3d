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
  (table $tab (export "table") 5 funcref)
  (elem (table $tab) (i32.const 0) funcref (ref.null func) (ref.null func) (ref.null func) (ref.null func) (ref.null func))
  (data (i32.const 0) "")
  (func $f0 (export "f0") (type $t0) (param $p0 i32) (param $p1 i32) (result i32)
    (local $a0 i32) (local $a1 i32) (local $b0 i64) (local $b1 i64) (local $c0 f32) (local $c1 f32) (local $d0 f64) (local $d1 f64) (local $k0 i32) (local $k1 i32) (local $cf32 f32) (local $cf64 f64)
    i32.const 0)
  (func $f1 (export "f1") (type $t1) (param $p0 i64) (result i64)
    (local $a0 i32) (local $a1 i32) (local $b0 i64) (local $b1 i64) (local $c0 f32) (local $c1 f32) (local $d0 f64) (local $d1 f64) (local $k0 i32) (local $k1 i32) (local $cf32 f32) (local $cf64 f64)
    i64.const 0)
  (func $f2 (export "f2") (type $t2) (param $p0 f64) (param $p1 i32) (result f64)
    (local $a0 i32) (local $a1 i32) (local $b0 i64) (local $b1 i64) (local $c0 f32) (local $c1 f32) (local $d0 f64) (local $d1 f64) (local $k0 i32) (local $k1 i32) (local $cf32 f32) (local $cf64 f64)
    i32.const 0
    local.set $a0
    local.get $p0
    f64.sqrt
    local.set $cf64
    f64.const nan
    local.get $cf64
    local.get $cf64
    local.get $cf64
    f64.ne
    select
    global.set $g3
    f64.const 0x0.0p+0)
)
