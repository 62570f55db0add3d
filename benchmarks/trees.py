"""Two builds of TensorWasm on the same PolyBench programs: ``python -m benchmarks.trees``.

A change to the runtime is judged against the tree before it, on one machine, in one
sitting: machines differ by more than most changes (wasmtime's gemm kernel took 1.48 s on
one H100 host and 2.41 s on another), and so does one machine from hour to hour. This runs
each program under ``tensorwasm run`` from a base tree (``--base``, a copy of the package's
folders at another commit: ``git archive REV | tar -x -C build/base``) and from this one,
once untimed each (compiled code cached; each tree's bytecode written first), then ``--repeat`` rounds alternating the trees;
with ``--plain``, plain wasmtime once first, whose dump both trees' dumps must equal. It
prints a line a program (each tree's kernel times, PolyBench's timer, their median and the
median process time) and writes the rows as JSON (``--out``). ``--base-env NAME=VALUE``
(repeatable) sets a variable for the base's processes alone: with ``--base .`` it weighs a
setting against the default in the same tree.

    python -m benchmarks.trees --base build/base --device gpu --plain fdtd-2d jacobi-2d
    python -m benchmarks.trees --base . --base-env TENSORWASM_HOST_WHILE_STARTING=off deriche
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.polybench import PLAIN, ROOT, compile_bytecode, split_output


def run(command: list[str], tree: Path, timeout: float, extra: dict[str, str] | None = None) -> dict:
    """One process, in ``tree`` (``python -m`` imports the package of its working folder),
    with the variables ``extra`` set as well."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    env.update(extra or {})
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree, timeout=timeout)
    seconds = time.perf_counter() - start
    kernel, dump = split_output(done.stdout)
    return {
        "status": done.returncode,
        "kernel": kernel,
        "process": seconds,
        "dump": hashlib.sha256(dump.encode()).hexdigest(),
        "stderr": done.stderr[-2000:],
    }


def compare(name: str, wasm: Path, trees: dict[str, Path], device: str, repeat: int, plain: bool,
            timeout: float, envs: dict[str, dict[str, str]] | None = None, idle: float = 0.0) -> dict:  # fmt: skip
    """One program under every tree (and plain wasmtime where ``plain``): the row. ``envs``:
    per tree's label, variables its processes run with; ``idle``: seconds slept before each
    timed run (the device left idle, as while plain wasmtime runs between a benchmark's runs:
    a CUDA context then takes longer to make)."""
    envs = envs or {}
    wasm = wasm.resolve()
    reference = run([sys.executable, "-c", PLAIN, str(wasm)], ROOT, timeout) if plain else None
    command = [sys.executable, "-m", "tensorwasm", "run", "--device", device, str(wasm)]
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for label, tree in trees.items():
        run(command, tree, timeout, envs.get(label))  # untimed: fills the caches
    for _ in range(repeat):
        for label, tree in trees.items():
            time.sleep(idle)
            runs[label].append(run(command, tree, timeout, envs.get(label)))
    row: dict = {"program": name, "wasmtime_kernel": reference["kernel"] if reference else None}
    dumps = {r["dump"] for done in runs.values() for r in done}
    if reference is not None:
        dumps.add(reference["dump"])
    row["identical"] = len(dumps) == 1 and all(r["status"] == 0 for done in runs.values() for r in done)
    for label, done in runs.items():
        kernels = [r["kernel"] for r in done if r["kernel"] is not None]
        row[label] = {
            "kernels": kernels,
            "kernel": statistics.median(kernels) if kernels else None,
            "process": statistics.median(r["process"] for r in done),
            "failed": [r["stderr"] for r in done if r["status"] != 0][:1],
        }
    return row


def line(row: dict) -> str:
    text = f"{row['program']:14} {'identical' if row['identical'] else 'DIFFERENT'}"
    if row["wasmtime_kernel"] is not None:
        text += f" | wasmtime {row['wasmtime_kernel']:.3f}"
    for label, r in row.items():
        if not isinstance(r, dict) or r["kernel"] is None:
            continue
        text += f" | {label} {min(r['kernels']):.3f}-{max(r['kernels']):.3f} med {r['kernel']:.3f}"
        if row["wasmtime_kernel"]:
            text += f" ({row['wasmtime_kernel'] / r['kernel']:.2f}x)"
        text += f" proc {r['process']:.2f}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trees", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("programs", nargs="+", help="PolyBench programs (NAME.wasm under --wasm-dir)")
    parser.add_argument("--base", type=Path, required=True, help="the other tree (its package folders)")
    parser.add_argument("--wasm-dir", type=Path, default=ROOT / "build" / "polybench" / "large")
    parser.add_argument("--device", default="gpu", choices=("cpu", "gpu", "auto"))
    parser.add_argument("--repeat", type=int, default=2, help="timed rounds (each tree once a round)")
    parser.add_argument("--plain", action="store_true", help="plain wasmtime first: its kernel time and dump")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--idle", type=float, default=0.0, help="seconds slept before each timed run")
    parser.add_argument("--out", type=Path, help="the rows as JSON")
    parser.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable the base's processes alone run with (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    base_env = {}
    for spec in args.base_env:
        name, eq, value = spec.partition("=")
        if not eq or not name:
            print(f"benchmarks.trees: --base-env takes NAME=VALUE, not {spec!r}", file=sys.stderr)
            return 2
        base_env[name] = value
    if not (args.base / "tensorwasm" / "__init__.py").exists():
        print(f"benchmarks.trees: {args.base} holds no tensorwasm package (--base)", file=sys.stderr)
        return 2
    missing = [p for p in args.programs if not (args.wasm_dir / f"{p}.wasm").exists()]
    if missing:
        print(f"benchmarks.trees: no {', '.join(missing)} under {args.wasm_dir}", file=sys.stderr)
        return 2
    trees = {"base": args.base.resolve(), "this": ROOT}
    for tree in trees.values():  # as installed: each process reads bytecode, compiles nothing
        compile_bytecode(tree)
    rows = []
    for name in args.programs:
        row = compare(name, args.wasm_dir / f"{name}.wasm", trees, args.device, max(1, args.repeat), args.plain,
                      args.timeout, {"base": base_env}, args.idle)  # fmt: skip
        rows.append(row)
        print(line(row), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
