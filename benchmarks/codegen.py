"""LLVM's NVPTX backend against libNVVM, kernel by kernel: ``python -m benchmarks.codegen``.

Each program of the suite runs under ``tensorwasm run`` (every loop offloaded) twice per code
generator, with ``TENSORWASM_PTX_BACKEND`` set to ``llvm``, then ``nvvm``, each in a cache of
its own; CUDA events time every launch (:class:`benchmarks.runner.LaunchEvents`), and a
kernel's time is the lesser of the two runs. The program's output under each must equal
wasmtime's, byte for byte: only then may the faster code generator be chosen for a kernel.
The table gives, per kernel, both times, the ratio and the choice.

It needs a GPU: without one it says so on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.programs import PROGRAMS, SIZE_SETS

CODEGENS = ("llvm", "nvvm")
RUNS = 2  # per code generator; the lesser time counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codegen", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", choices=SIZE_SETS, default="small", help="the suite's size set")
    parser.add_argument(
        "--programs", default=",".join(PROGRAMS), help="comma-separated programs of the suite"
    )
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per code generator (the fastest counts)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    args = parser.parse_args(argv)
    unknown = [name for name in args.programs.split(",") if name not in PROGRAMS]
    if unknown:
        parser.error(f"no program {', '.join(unknown)} in the suite (choose from {', '.join(PROGRAMS)})")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def measure(program, params: dict, codegen: str, runs: int) -> dict:
    """Per kernel entry, its least device seconds over ``runs`` runs with ``codegen``, and
    whether every run's output and exit status equalled wasmtime's."""
    from benchmarks.runner import run_tensorwasm, run_wasmtime

    expected = run_wasmtime(program.wasm, program.argv(params))
    kernels: dict[str, float] = {}
    identical = True
    saved = {name: os.environ.get(name) for name in ("TENSORWASM_PTX_BACKEND", "TENSORWASM_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="tensorwasm-codegen-") as cache:
        os.environ["TENSORWASM_PTX_BACKEND"] = codegen
        os.environ["TENSORWASM_CACHE_DIR"] = cache
        try:
            for _ in range(runs):
                result = run_tensorwasm(program, params, "gpu", "always")
                identical &= result["output"] == expected["output"] and result["status"] == expected["status"]
                for loop in result["loops"]:
                    if loop["device_seconds"] is not None and loop["offloaded"]:
                        seconds = loop["device_seconds"]
                        kernels[loop["entry"]] = min(seconds, kernels.get(loop["entry"], seconds))
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return {"kernels": kernels, "identical_output": identical}


def compare(program: str, label: str, by_codegen: dict[str, dict]) -> list[dict]:
    """One row per kernel launched under both code generators: both times, the ratio (LLVM's
    time over libNVVM's: above 1, libNVVM is faster) and the choice, which is LLVM's
    wherever either output differed from wasmtime's."""
    llvm, nvvm = by_codegen["llvm"], by_codegen["nvvm"]
    exact = llvm["identical_output"] and nvvm["identical_output"]
    rows = []
    for entry in sorted(set(llvm["kernels"]) | set(nvvm["kernels"])):
        a, b = llvm["kernels"].get(entry), nvvm["kernels"].get(entry)
        ratio = a / b if a and b else None
        choice = "nvvm" if exact and ratio is not None and ratio > 1 else "llvm"
        rows.append({"program": program, "size": label, "kernel": entry, "llvm_seconds": a, "nvvm_seconds": b,
                     "ratio": ratio, "identical_output": exact, "choice": choice})  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    """The rows as an aligned text table, microseconds."""

    def us(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e6:.1f}"

    header = ("program", "size", "kernel", "llvm us", "nvvm us", "llvm/nvvm", "output", "choice")
    body = [
        (r["program"], r["size"], r["kernel"], us(r["llvm_seconds"]), us(r["nvvm_seconds"]),
         "-" if r["ratio"] is None else f"{r['ratio']:.2f}", "identical" if r["identical_output"] else "DIFFERS",
         r["choice"])
        for r in rows
    ]  # fmt: skip
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in [header, *body])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.runner import pick_device

    device, why = pick_device("gpu")
    if device != "gpu":
        print(f"benchmarks.codegen: no GPU ({why}): it compares kernel times on the GPU", file=sys.stderr)
        return 2
    rows: list[dict] = []
    for name in args.programs.split(","):
        program = PROGRAMS[name]
        for values in program.sizes[args.sizes]:
            params = program.bind(values)
            label = program.label(params)
            found = {codegen: measure(program, params, codegen, args.runs) for codegen in CODEGENS}
            rows.extend(compare(name, label, found))
            print(f"{name} {label}: done", file=sys.stderr)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["identical_output"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
