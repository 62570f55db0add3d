;; Wavefronts whose row loop carries the value a row stored last at its first element
;; (tests/compiler/test_rotated.py): in "carry" the next row's u is what memory holds there;
;; in "overwrite" the row stores there again after, so the value carried is not memory's.
;; Rows of 8 i32 at $a, rows 1 to 14 updated, columns 1 to 6.
(module
  (memory (export "memory") 1)
  (func $fill (export "fill") (param $a i32)
    (local $n i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $n) (i32.const 128)))
      (i32.store (i32.add (local.get $a) (i32.shl (local.get $n) (i32.const 2)))
                 (i32.mul (i32.add (local.get $n) (i32.const 1)) (i32.const -1640531535)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $next))))
  (func $carry (export "carry") (param $steps i32) (param $a i32)
    (local $t i32) (local $k i32) (local $j i32) (local $u i32) (local $x i32)
    (local.set $t (i32.const 0))
    (block $done (loop $time
      (br_if $done (i32.ge_s (local.get $t) (local.get $steps)))
      (local.set $u (i32.load (local.get $a)))
      (local.set $k (i32.const 1))
      (block $rows_done (loop $rows
        (br_if $rows_done (i32.ge_s (local.get $k) (i32.const 15)))
        (local.set $j (i32.const 1))
        (block $cols_done (loop $cols
          (br_if $cols_done (i32.ge_s (local.get $j) (i32.const 7)))
          (i32.store (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (local.get $j)) (i32.const 2))) (i32.add (i32.add (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (i32.sub (local.get $k) (i32.const 1)) (i32.const 3)) (local.get $j)) (i32.const 2)))) (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (i32.add (local.get $k) (i32.const 1)) (i32.const 3)) (local.get $j)) (i32.const 2))))) (i32.add (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.sub (local.get $j) (i32.const 1))) (i32.const 2)))) (local.get $u))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br $cols)))
        (local.set $x (i32.xor (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.const 1)) (i32.const 2)))) (i32.rotl (local.get $u) (i32.const 5))))
        (i32.store (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.const 0)) (i32.const 2))) (local.get $x))
        (local.set $u (local.get $x))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $rows)))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $time))))
  (func $overwrite (export "overwrite") (param $steps i32) (param $a i32)
    (local $t i32) (local $k i32) (local $j i32) (local $u i32) (local $x i32)
    (local.set $t (i32.const 0))
    (block $done (loop $time
      (br_if $done (i32.ge_s (local.get $t) (local.get $steps)))
      (local.set $u (i32.load (local.get $a)))
      (local.set $k (i32.const 1))
      (block $rows_done (loop $rows
        (br_if $rows_done (i32.ge_s (local.get $k) (i32.const 15)))
        (local.set $j (i32.const 1))
        (block $cols_done (loop $cols
          (br_if $cols_done (i32.ge_s (local.get $j) (i32.const 7)))
          (i32.store (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (local.get $j)) (i32.const 2))) (i32.add (i32.add (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (i32.sub (local.get $k) (i32.const 1)) (i32.const 3)) (local.get $j)) (i32.const 2)))) (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (i32.add (local.get $k) (i32.const 1)) (i32.const 3)) (local.get $j)) (i32.const 2))))) (i32.add (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.sub (local.get $j) (i32.const 1))) (i32.const 2)))) (local.get $u))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br $cols)))
        (local.set $x (i32.xor (i32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.const 1)) (i32.const 2)))) (i32.rotl (local.get $u) (i32.const 5))))
        (i32.store (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.const 0)) (i32.const 2))) (local.get $x))
        (i32.store (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 3)) (i32.const 0)) (i32.const 2))) (i32.add (local.get $x) (i32.const 1)))
        (local.set $u (local.get $x))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $rows)))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $time))))
)
