"""How the cost of each command grows with the input: time and peak memory per size.

Generated modules, each size twice the last, run in fresh processes with the cache off:

- ``functions``: N small functions, each with a counted loop (compile time per function);
- ``body``: one function whose body holds N straight-line blocks (a large body);
- ``nesting``: one function with N loops nested inside each other (the loop analysis);
- ``counted``: N counted loops nested, each with a counter of its own set before it starts
  (clang's shape: N locals, each dead at the headers outside its loop), the innermost
  storing to memory (LLVM cannot delete the nest). Every loop heading a nest at most
  ``MAX_LOOP_DEPTH`` (64) deep is a candidate whose trip count and inner loops' bounds the
  analysis works out, and each one around them is rejected for its depth alone
  (``nesting`` rejects each loop at its first header argument), so this is the shape that
  times the loop analysis of ``inspect`` and ``run``.

For each, ``tensorwasm inspect --stage loops``, ``compile`` and ``run --device cpu`` are
timed against plain wasmtime compiling and instantiating the same module: wall-clock and
CPU seconds (on a loaded machine the second is the steadier) and peak memory. Work linear
in the input doubles with each size: the growth lines give the ratio of the last two sizes.

Usage: ``python -m benchmarks.scaling [--shape functions,body,nesting,counted] [--sizes 256,512,...]
[--commands wasmtime,inspect,compile,run]`` (``--shape counted --commands inspect,run``: the
loop analysis alone, as the command line and ``run`` do it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wasmtime

PLAIN = """
import sys, wasmtime
engine = wasmtime.Engine(); store = wasmtime.Store(engine)
module = wasmtime.Module.from_file(engine, sys.argv[1])
instance = wasmtime.Instance(store, module, [])
"""

SIZES = {
    "functions": (250, 500, 1000, 2000),
    "body": (2500, 5000, 10000, 20000),
    "nesting": (200, 400, 800, 1600),
    "counted": (200, 400, 800, 1600),
}


def _loop_function(k: int) -> str:
    return (
        f'(func $f{k} (export "f{k}") (param $n i32) (local $i i32)\n'
        "  (block $done (loop $top\n"
        "    (br_if $done (i32.ge_s (local.get $i) (local.get $n)))\n"
        "    (i32.store (i32.shl (local.get $i) (i32.const 2)) (i32.add (local.get $i) (i32.const 1)))\n"
        "    (local.set $i (i32.add (local.get $i) (i32.const 1)))\n"
        "    (br $top))))\n"
    )


def module_text(shape: str, n: int) -> str:
    """The WAT of the ``shape`` module at size ``n``."""
    if shape == "functions":
        return '(module (memory (export "memory") 1)\n' + "".join(_loop_function(k) for k in range(n)) + ")"
    if shape == "body":
        blocks = "".join(
            f"(block (local.set $x (i32.add (local.get $x) (i32.const {k}))) (br_if 0 (local.get $x)))\n"
            for k in range(n)
        )
        return f'(module (func (export "f") (param $x i32) (result i32)\n{blocks} (local.get $x)))'
    if shape == "counted":
        return _counted_nest(n)
    opens = "".join(f"(block $b{k} (loop $l{k} (br_if $b{k} (i32.eqz (local.get $x)))\n" for k in range(n))
    body = "(local.set $x (i32.sub (local.get $x) (i32.const 1)))\n"
    tails = "".join(f"(br $l{k})))\n" for k in reversed(range(n)))
    return f'(module (func (export "f") (param $x i32)\n{opens}{body}{tails}))'


def _counted_nest(n: int) -> str:
    locals_ = " ".join(f"(local $i{k} i32)" for k in range(n))
    opens = "".join(
        f"(local.set $i{k} (i32.const 0)) (block $b{k} (loop $l{k}"
        f" (br_if $b{k} (i32.ge_u (local.get $i{k}) (local.get $n)))\n"
        for k in range(n)
    )
    body = f"(i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (local.get $i{n - 1})))\n"
    tails = "".join(
        f"(local.set $i{k} (i32.add (local.get $i{k}) (i32.const 1))) (br $l{k})))\n"
        for k in reversed(range(n))
    )
    return f'(module (memory (export "memory") 1) (func (export "f") (param $n i32) {locals_}\n{opens}{body}{tails}))'


def _measure(argv: list[str]) -> tuple[float, float, int, int]:
    """Wall-clock seconds, CPU seconds, peak memory (MiB) and exit status of one fresh process."""
    start = time.perf_counter()
    child = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TENSORWASM_CACHE": "off"},
    )
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss >> 10, child.returncode


def commands(path: Path, work: Path) -> dict[str, list[str]]:
    tw = [sys.executable, "-m", "tensorwasm"]
    return {
        "wasmtime": [sys.executable, "-c", PLAIN, str(path)],
        "inspect": [*tw, "inspect", str(path), "--stage", "loops"],
        "compile": [*tw, "compile", str(path), "-o", str(work / "out"), "--target", "sm_90"],
        "run": [*tw, "run", str(path), "--device", "cpu", "--invoke", "f", "0"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="functions,body,nesting,counted")
    parser.add_argument("--sizes", default=None, help="comma-separated sizes (default: per shape)")
    parser.add_argument("--commands", default="wasmtime,inspect,compile,run", help="which commands to time")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    for shape in args.shape.split(","):
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES[shape]
        print(f"{shape}:")
        rows: dict[str, list[tuple[float, float, int]]] = {}
        with tempfile.TemporaryDirectory(prefix="tw-scaling-") as tmp:
            work = Path(tmp)
            for n in sizes:
                path = work / f"{shape}-{n}.wasm"
                path.write_bytes(wasmtime.wat2wasm(module_text(shape, n)))
                cells = []
                chosen = args.commands.split(",")
                for name, line in commands(path, work).items():
                    if name not in chosen:
                        continue
                    seconds, cpu, mib, status = _measure(line)
                    rows.setdefault(name, []).append((seconds, cpu, mib))
                    cells.append(
                        f"{name} {seconds:7.2f} s ({cpu:6.2f} s CPU) {mib:5d} MiB"
                        f"{'' if status in (0, 2) else f' (exit {status})'}"
                    )
                print(f"  n={n:6d} {path.stat().st_size / 1e6:6.2f} MB: " + "; ".join(cells))
        for name, points in rows.items():
            if len(points) >= 2:
                (t0, c0, m0), (t1, c1, m1) = points[-2], points[-1]
                print(
                    f"  growth at the last doubling, {name}: time x{t1 / max(t0, 1e-9):.2f}, "
                    f"CPU x{c1 / max(c0, 1e-9):.2f}, memory x{m1 / max(m0, 1):.2f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
