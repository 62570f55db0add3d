"""What a declined loop costs at each arrival: ``python -m benchmarks.declines``.

A loop nest too small to pay for a launch (an outer loop around an inner one: no Wasm-side
filter can judge its work, so every arrival used to reach the host) is reached ``--arrivals``
times from inside one Wasm call, in auto mode on the host backend. Timed: plain wasmtime,
tensorwasm with the gates (:class:`runtime.planning.ArrivalGate`) as they are, and with
them held open (every arrival asks the host, which declines: the cost before the gates).
Printed per arrival, beyond plain wasmtime's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import wasmtime

from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import ArrivalGate

# nest(n, m): c[i][j] = a[i][j] + 1.0 over an n x m grid of f64 at 0 and 65536;
# repeat(r, n, m) calls it r times.
NEST = """(module
  (memory (export "memory") 4)
  (func $nest (param $n i32) (param $m i32) (local $i i32) (local $j i32) (local $at i32)
    (block $done (loop $rows
      (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
      (local.set $j (i32.const 0))
      (block $row (loop $cols
        (br_if $row (i32.ge_s (local.get $j) (local.get $m)))
        (local.set $at (i32.shl (i32.add (i32.mul (local.get $i) (i32.const 64)) (local.get $j)) (i32.const 3)))
        (f64.store offset=65536 (local.get $at) (f64.add (f64.load (local.get $at)) (f64.const 1)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $cols)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rows))))
  (func (export "repeat") (param $r i32) (param $n i32) (param $m i32)
    (block $done (loop $again
      (br_if $done (i32.eqz (local.get $r)))
      (call $nest (local.get $n) (local.get $m))
      (local.set $r (i32.sub (local.get $r) (i32.const 1)))
      (br $again)))))"""


def _plain(wasm: bytes, arrivals: int) -> float:
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), [])
    run = instance.exports(store)["repeat"]
    start = time.perf_counter()
    run(store, arrivals, 2, 2)
    return time.perf_counter() - start


def _offloaded(wasm: bytes, arrivals: int, gates: bool) -> tuple[float, dict]:
    offload = OffloadModule(wasm, device="cpu", mode="auto")
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(store.engine))
    offload.bind(store, instance.exports(store))
    run = instance.exports(store)["repeat"]
    run(store, 8, 2, 2)  # the first arrivals load the guards and the cost model
    saved = ArrivalGate.BACKOFF_AFTER
    if not gates:
        ArrivalGate.BACKOFF_AFTER = 1 << 62
    try:
        start = time.perf_counter()
        run(store, arrivals, 2, 2)
        seconds = time.perf_counter() - start
    finally:
        ArrivalGate.BACKOFF_AFTER = saved
    offload.close()
    loop = min(offload.loops, key=lambda lp: lp.stats.offset)  # the outer loop (the inner one is never asked)
    return seconds, {"arrivals": loop.stats.arrivals, "declined": dict(loop.stats.declined)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.declines", description=__doc__)
    parser.add_argument("--arrivals", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    wasm = wasmtime.wat2wasm(NEST)
    n = args.arrivals
    plain = min(_plain(wasm, n) for _ in range(3))
    held, held_counts = min((_offloaded(wasm, n, gates=False) for _ in range(3)), key=lambda r: r[0])
    gated, gated_counts = min((_offloaded(wasm, n, gates=True) for _ in range(3)), key=lambda r: r[0])
    result = {
        "arrivals": n,
        "plain_us_per_arrival": plain / n * 1e6,
        "ungated_extra_us_per_arrival": (held - plain) / n * 1e6,
        "gated_extra_us_per_arrival": (gated - plain) / n * 1e6,
        "ungated_counts": held_counts,
        "gated_counts": gated_counts,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{n} arrivals of a declined 2 x 2 nest: plain wasmtime {result['plain_us_per_arrival']:.3f} us each; "
              f"extra per arrival: every arrival asking the host {result['ungated_extra_us_per_arrival']:.2f} us, "
              f"with the gate {result['gated_extra_us_per_arrival']:.3f} us")  # fmt: skip
        print(f"  asking: {held_counts}\n  gated:  {gated_counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
