"""End-to-end ``tensorwasm run`` against plain wasmtime on the example programs.

Usage: ``python -m benchmarks.offload [--device gpu|cpu] [--small] [--json]``. Each program
runs once on plain wasmtime and once through ``tensorwasm run`` in this process; the output
must be byte-identical. Reported: both wall times, the speedup, and tensorwasm's split
(compile, kernel, transfers, everything else on wasmtime).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import wasmtime

from runtime.run import run

ROOT = Path(__file__).resolve().parents[1]
LARGE = {
    "matmul": ["1024"],
    "stencil": ["1024", "50"],
    "blur": ["2048", "2048", "4"],
    "histogram": ["2000000"],
}
SMALL = {"matmul": ["96"], "stencil": ["96", "5"], "blur": ["128", "96", "2"], "histogram": ["20000"]}


def plain(path: Path, args: list[str]) -> tuple[float, str]:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        wasi = wasmtime.WasiConfig()
        wasi.argv = [str(path), *args]
        wasi.stdout_file = out
        store.set_wasi(wasi)
        instance = linker.instantiate(store, wasmtime.Module.from_file(engine, str(path)))
        start = time.perf_counter()
        try:
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap:
            pass
        return time.perf_counter() - start, Path(out).read_text()


def offloaded(path: Path, args: list[str], device: str) -> tuple[dict, str]:
    captured = io.StringIO()
    fd = sys.stdout.fileno()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+") as sink:
        os.dup2(sink.fileno(), fd)  # WASI writes to the process's stdout directly
        try:
            with redirect_stdout(captured):
                _, prepared, timings = run(
                    path.read_bytes(), [str(path), *args], device=device, offload="always"
                )
        finally:
            sys.stdout.flush()
            os.dup2(saved, fd)
            os.close(saved)
        sink.seek(0)
        output = sink.read()
    stats = [lp.stats for lp in prepared.loops]
    timings["kernel_seconds"] = sum(s.kernel_seconds for s in stats)
    timings["transfer_seconds"] = sum(s.transfer_seconds for s in stats)
    timings["launches"] = sum(s.offloaded for s in stats)
    timings["bytes_moved"] = sum(s.bytes_in + s.bytes_out for s in stats)
    return timings, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--small", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, prog_args in (SMALL if args.small else LARGE).items():
        path = ROOT / f"examples/wasi/build/{name}.O2.wasm"
        base_seconds, expected = plain(path, prog_args)
        timings, output = offloaded(path, prog_args, args.device)
        total = timings["compile_seconds"] + timings["run_seconds"]
        rows.append({
            "program": name, "args": prog_args, "identical_output": output == expected,
            "wasmtime_seconds": base_seconds, "tensorwasm_seconds": total,
            "speedup": base_seconds / total, **timings,
        })  # fmt: skip
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    for r in rows:
        print(
            f"{r['program']} {' '.join(r['args'])}: wasmtime {r['wasmtime_seconds']:.3f} s, tensorwasm "
            f"{r['tensorwasm_seconds']:.3f} s ({r['speedup']:.1f}x; compile {r['compile_seconds'] * 1e3:.0f} ms, "
            f"kernels {r['kernel_seconds'] * 1e3:.1f} ms, transfers {r['transfer_seconds'] * 1e3:.1f} ms, "
            f"{r['launches']} launches, {r['bytes_moved'] / 1e6:.1f} MB moved); identical output: {r['identical_output']}"
        )
    compute = [r["speedup"] for r in rows if r["program"] in ("matmul", "stencil", "blur")]
    print(
        f"geometric mean speedup (matmul, stencil, blur): {math.exp(sum(map(math.log, compute)) / len(compute)):.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
