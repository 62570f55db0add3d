;; seidel-2d as clang-16 -O2 compiles it (tests/compiler/data/rotated.c's seidel: its row
;; loop carries the row's first element, loaded, to the next row), and the same with that
;; element written after its load (clobber): the next row must see the value carried, not
;; memory's (tests/compiler/test_rotated.py).
(module
  (memory (export "memory") 1)
  (func $seidel (export "seidel") (param i32 i32)
    (local i32 f64 i32 i32 i32 f64 f64 f64 f64 i32 f64 f64 f64)
    block  ;; label = @1
      local.get 0
      i32.const 1
      i32.lt_s
      br_if 0 (;@1;)
      i32.const 0
      local.set 2
      loop  ;; label = @2
        local.get 1
        f64.load
        local.set 3
        i32.const 1
        local.set 4
        local.get 1
        local.set 5
        loop  ;; label = @3
          local.get 4
          i32.const 1
          i32.add
          local.set 6
          local.get 1
          local.get 4
          i32.const 320
          i32.mul
          i32.add
          local.tee 4
          f64.load offset=8
          local.set 7
          local.get 4
          i32.const 328
          i32.add
          f64.load
          local.set 8
          local.get 4
          i32.const 320
          i32.add
          f64.load
          local.set 9
          local.get 4
          i32.const -312
          i32.add
          f64.load
          local.set 10
          i32.const 0
          local.set 11
          local.get 4
          f64.load
          local.tee 12
          local.set 13
          loop  ;; label = @4
            local.get 5
            local.get 11
            i32.add
            local.tee 4
            i32.const 328
            i32.add
            local.get 3
            local.get 10
            local.tee 14
            f64.add
            local.get 4
            i32.const 16
            i32.add
            f64.load
            local.tee 10
            f64.add
            local.get 13
            f64.add
            local.get 7
            f64.add
            local.get 4
            i32.const 336
            i32.add
            f64.load
            local.tee 7
            f64.add
            local.get 9
            f64.add
            local.get 8
            local.tee 3
            f64.add
            local.get 4
            i32.const 656
            i32.add
            f64.load
            local.tee 8
            f64.add
            f64.const 0x1.2p+3 (;=9;)
            f64.div
            local.tee 13
            f64.store
            local.get 3
            local.set 9
            local.get 14
            local.set 3
            local.get 11
            i32.const 8
            i32.add
            local.tee 11
            i32.const 304
            i32.ne
            br_if 0 (;@4;)
          end
          local.get 5
          i32.const 320
          i32.add
          local.set 5
          local.get 12
          local.set 3
          local.get 6
          local.set 4
          local.get 6
          i32.const 39
          i32.ne
          br_if 0 (;@3;)
        end
        local.get 2
        i32.const 1
        i32.add
        local.tee 2
        local.get 0
        i32.ne
        br_if 0 (;@2;)
      end
    end)
  (func $clobber (export "clobber") (param i32 i32)
    (local i32 f64 i32 i32 i32 f64 f64 f64 f64 i32 f64 f64 f64)
    block  ;; label = @1
      local.get 0
      i32.const 1
      i32.lt_s
      br_if 0 (;@1;)
      i32.const 0
      local.set 2
      loop  ;; label = @2
        local.get 1
        f64.load
        local.set 3
        i32.const 1
        local.set 4
        local.get 1
        local.set 5
        loop  ;; label = @3
          local.get 4
          i32.const 1
          i32.add
          local.set 6
          local.get 1
          local.get 4
          i32.const 320
          i32.mul
          i32.add
          local.tee 4
          f64.load offset=8
          local.set 7
          local.get 4
          i32.const 328
          i32.add
          f64.load
          local.set 8
          local.get 4
          i32.const 320
          i32.add
          f64.load
          local.set 9
          local.get 4
          i32.const -312
          i32.add
          f64.load
          local.set 10
          i32.const 0
          local.set 11
          local.get 4
          f64.load
          local.tee 12
          local.set 13
          local.get 4
          local.get 12
          f64.const 0x1p+0
          f64.add
          f64.store
          loop  ;; label = @4
            local.get 5
            local.get 11
            i32.add
            local.tee 4
            i32.const 328
            i32.add
            local.get 3
            local.get 10
            local.tee 14
            f64.add
            local.get 4
            i32.const 16
            i32.add
            f64.load
            local.tee 10
            f64.add
            local.get 13
            f64.add
            local.get 7
            f64.add
            local.get 4
            i32.const 336
            i32.add
            f64.load
            local.tee 7
            f64.add
            local.get 9
            f64.add
            local.get 8
            local.tee 3
            f64.add
            local.get 4
            i32.const 656
            i32.add
            f64.load
            local.tee 8
            f64.add
            f64.const 0x1.2p+3 (;=9;)
            f64.div
            local.tee 13
            f64.store
            local.get 3
            local.set 9
            local.get 14
            local.set 3
            local.get 11
            i32.const 8
            i32.add
            local.tee 11
            i32.const 304
            i32.ne
            br_if 0 (;@4;)
          end
          local.get 5
          i32.const 320
          i32.add
          local.set 5
          local.get 12
          local.set 3
          local.get 6
          local.set 4
          local.get 6
          i32.const 39
          i32.ne
          br_if 0 (;@3;)
        end
        local.get 2
        i32.const 1
        i32.add
        local.tee 2
        local.get 0
        i32.ne
        br_if 0 (;@2;)
      end
    end))
