;; A small module for `tensorwasm invoke`: recursion, a loop over linear memory, floats.
(module
  (memory (export "memory") 1)
  (func $fib (export "fib") (param $n i32) (result i32)
    local.get $n i32.const 2 i32.lt_u
    if (result i32) local.get $n
    else
      local.get $n i32.const 1 i32.sub call $fib
      local.get $n i32.const 2 i32.sub call $fib i32.add
    end)
  ;; Fill n f64 at address 0 with i * scale and return their sum.
  (func (export "fill_sum") (param $n i32) (param $scale f64) (result f64)
    (local $i i32) (local $sum f64) (local $v f64)
    (block $done (loop $next
      local.get $i local.get $n i32.ge_u br_if $done
      local.get $i f64.convert_i32_u local.get $scale f64.mul local.set $v
      local.get $i i32.const 3 i32.shl local.get $v f64.store
      local.get $sum local.get $v f64.add local.set $sum
      local.get $i i32.const 1 i32.add local.set $i
      br $next))
    local.get $sum)
  (func (export "nearest") (param f32) (result f32) local.get 0 f32.nearest)
  (func (export "div") (param i32 i32) (result i32) local.get 0 local.get 1 i32.div_s))
