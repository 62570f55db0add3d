"""A program whose loops all stay on the CPU, each run in a fresh process: plain wasmtime-py
against ``tensorwasm run`` on each device, the cache warm. What it shows is tensorwasm's own
start: Python's imports, reading the cached preparation and wasmtime's code, deciding.

Usage: ``python -m benchmarks.start [--rounds 20] [--devices cpu,auto] [--json] [ARGS...]``
(default ARGS: ``2000000``, the histogram's element count). The commands run in turn,
round after round, so a machine's drift reaches each alike; reported: the minimum and the
median of each, and each against plain wasmtime's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT, compile_bytecode

PROGRAM = ROOT / "examples/wasi/build/histogram.O2.wasm"

# Plain wasmtime-py, as a user runs a WASI command module (it compiles the module each run).
PLAIN = """
import sys, wasmtime
engine = wasmtime.Engine(); store = wasmtime.Store(engine); linker = wasmtime.Linker(engine)
linker.define_wasi(); wasi = wasmtime.WasiConfig(); wasi.argv = sys.argv[1:]; store.set_wasi(wasi)
instance = linker.instantiate(store, wasmtime.Module.from_file(engine, sys.argv[1]))
try:
    instance.exports(store)["_start"](store)
except wasmtime.ExitTrap:
    pass
"""


def commands(program: Path, args: list[str], devices: list[str], mode: str = "auto") -> dict[str, list[str]]:
    """Plain wasmtime's command line and ``tensorwasm run``'s on each device."""
    found = {"wasmtime": [sys.executable, "-c", PLAIN, str(program), *args]}
    for device in devices:
        found[f"tensorwasm {device}"] = [
            sys.executable, "-m", "tensorwasm", "run", str(program), *args, "--device", device, "--offload", mode,
        ]  # fmt: skip
    return found


def interleaved(lines: dict[str, list[str]], rounds: int) -> dict[str, dict[str, float]]:
    """Seconds of each command, run in turn for ``rounds`` rounds after one to warm the
    caches: the minimum and the median of each."""
    compile_bytecode()
    times: dict[str, list[float]] = {name: [] for name in lines}
    for warm in (True, *(False for _ in range(rounds))):
        for name, line in lines.items():
            start = time.perf_counter()
            subprocess.run(line, capture_output=True, check=True, cwd=ROOT)
            if not warm:
                times[name].append(time.perf_counter() - start)
    return {name: {"min": min(t), "median": statistics.median(t)} for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--devices", default="cpu,auto")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("args", nargs="*", default=["2000000"])
    options = parser.parse_args()
    found = interleaved(commands(PROGRAM, options.args, options.devices.split(",")), options.rounds)
    if options.json:
        print(json.dumps(found, indent=2))
        return 0
    plain = found["wasmtime"]
    print(f"{PROGRAM.name} {' '.join(options.args)}, fresh processes, {options.rounds} rounds interleaved:")
    for name, t in found.items():
        print(
            f"  {name}: min {t['min'] * 1e3:.1f} ms ({t['min'] / plain['min']:.2f}x), "
            f"median {t['median'] * 1e3:.1f} ms ({t['median'] / plain['median']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
