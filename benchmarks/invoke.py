"""Per-call cost of whole-function execution: ``invoke`` on each backend, for a trivial function
(pure overhead) and a small loop, median over many calls.

Usage: ``python -m benchmarks.invoke [--backend cpu|gpu|wasmtime ...] [--calls N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from tensorwasm.dialect.types import I32
from tests.conftest import wat

MODULE = """
(module
  (func (export "inc") (param i32) (result i32) local.get 0 i32.const 1 i32.add)
  (func (export "loop") (param $n i32) (result i32) (local $i i32) (local $s i32)
    (block $d (loop $l local.get $i local.get $n i32.ge_u br_if $d
      local.get $s local.get $i i32.xor i32.const 3 i32.mul local.set $s
      local.get $i i32.const 1 i32.add local.set $i br $l)) local.get $s))
"""


def measure(backend: str, calls: int) -> dict:
    from tensorwasm.runtime.cli import _open_backend

    executor = _open_backend(backend, wat(MODULE))
    out = {"backend": backend}
    for name, args in (("inc", [(I32, 41)]), ("loop", [(I32, 1000)])):
        executor.call(name, args)  # warm up
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            executor.call(name, args)
            times.append(time.perf_counter() - start)
        out[f"{name}_us"] = statistics.median(times) * 1e6
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", action="append", choices=["wasmtime", "cpu", "gpu"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(b, args.calls) for b in args.backend or ["wasmtime", "cpu"]]
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        for r in results:
            print(
                f"{r['backend']}: per call {r['inc_us']:.1f} us (inc), {r['loop_us']:.1f} us (1000-iteration loop)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
