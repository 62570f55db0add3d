"""End-to-end ``tensorwasm run`` against plain wasmtime on the example programs.

Usage: ``python -m benchmarks.offload [--device gpu|cpu] [--sizes small|large|xlarge] [--mode auto|always] [--simd] [--json]``,
or ``python -m benchmarks.offload --compare SCALAR.json SIMD.json`` to put two runs' JSON side
by side (this module's ``--json`` or the suite's, ``python -m benchmarks``), scalar builds
against ``-msimd128`` builds: each program's speedup over its own build on wasmtime, and
their ratio (``scripts/gpu-check --simd`` runs both on the GPU and prints it).
``large`` is a few seconds of wasmtime per program; ``xlarge`` (a 2048 x 2048 matrix product,
a 4096 x 4096 stencil over 200 steps, a 4096 x 4096 image blurred 8 times, a step of 65536
bodies) is where fixed costs (start-up, transfers in and out, per-launch overhead) have faded.
Each program runs once on plain wasmtime and twice through ``tensorwasm run`` in this
process: cold (an empty cache) and warm (the cache the cold run filled, the in-memory layer
dropped, as a new process would find it). The output must be byte-identical. Reported:
the wall times, the speedups, and tensorwasm's split (prepare and compile, kernel,
transfers, everything else on wasmtime). wasmtime's time includes compiling the module,
as tensorwasm's does.
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

from benchmarks import start
from tensorwasm.runtime.cache import default_cache
from tensorwasm.runtime.run import run

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "small": {
        "matmul": ["96"], "stencil": ["96", "5"], "blur": ["128", "96", "2"], "histogram": ["20000"],
        "nbody": ["128", "1"],
    },
    "large": {
        "matmul": ["1024"], "stencil": ["1024", "50"], "blur": ["2048", "2048", "4"], "histogram": ["2000000"],
        "nbody": ["16384", "4"],
    },
    "xlarge": {
        "matmul": ["2048"], "stencil": ["4096", "200"], "blur": ["4096", "4096", "8"], "histogram": ["16000000"],
        "nbody": ["65536", "1"],
    },
}  # fmt: skip


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
        start = time.perf_counter()
        instance = linker.instantiate(store, wasmtime.Module.from_file(engine, str(path)))
        try:
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap:
            pass
        return time.perf_counter() - start, Path(out).read_text()


def offloaded(path: Path, args: list[str], device: str, mode: str = "always") -> tuple[dict, str]:
    captured = io.StringIO()
    fd = sys.stdout.fileno()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+") as sink:
        os.dup2(sink.fileno(), fd)  # WASI writes to the process's stdout directly
        try:
            with redirect_stdout(captured):
                _, prepared, timings = run(path.read_bytes(), [str(path), *args], device=device, offload=mode)
        finally:
            sys.stdout.flush()
            os.dup2(saved, fd)
            os.close(saved)
        sink.seek(0)
        output = sink.read()
    # Compiles still under way (untimed): their code lands in the cache, as a process's does
    # at its exit, so that the warm run finds what a new process would (the suite's runner
    # waits the same way).
    prepared.kernels.wait()
    stats = [lp.stats for lp in prepared.loops]
    timings["kernel_seconds"] = sum(s.kernel_seconds for s in stats)
    timings["transfer_seconds"] = sum(s.transfer_seconds for s in stats)
    timings["launches"] = sum(s.offloaded for s in stats)
    timings["bytes_moved"] = sum(s.bytes_in + s.bytes_out for s in stats)
    return timings, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="gpu")
    parser.add_argument(
        "--sizes", default="large", choices=sorted(SIZES), help="problem sizes (small: a smoke test)"
    )
    parser.add_argument(
        "--small", action="store_const", const="small", dest="sizes", help="the same as --sizes small"
    )
    parser.add_argument(
        "--mode",
        default="auto",
        choices=["always", "auto"],
        help="offload mode (default: auto, as tensorwasm run)",
    )
    parser.add_argument(
        "--simd",
        action="store_true",
        help="run the -msimd128 builds (examples/wasi/build/<name>.O2.simd.wasm)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("SCALAR", "SIMD"),
        help="print scalar against SIMD speedups from two runs' JSON (this module's or the suite's)",
    )
    args = parser.parse_args()
    if args.compare:
        documents = [json.loads(Path(p).read_text()) for p in args.compare]
        print("\n".join(simd_table(documents[0], documents[1])))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["TENSORWASM_CACHE_DIR"] = cache_dir
        for name, prog_args in SIZES[args.sizes].items():
            rows.append(measure(name, prog_args, args.device, args.mode, args.simd))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    for r in rows:
        for phase in ("cold", "warm"):
            t = r[phase]
            print(
                f"{r['program']} {' '.join(r['args'])} ({phase}): wasmtime {r['wasmtime_seconds']:.3f} s, tensorwasm "
                f"{t['tensorwasm_seconds']:.3f} s ({t['speedup']:.1f}x; prepare {t['compile_seconds'] * 1e3:.0f} ms, "
                f"kernels {t['kernel_seconds'] * 1e3:.1f} ms, transfers {t['transfer_seconds'] * 1e3:.1f} ms, "
                f"{t['launches']} launches, {t['bytes_moved'] / 1e6:.1f} MB moved); identical output: "
                f"{t['identical_output']}"
            )
        fresh = r.get("fresh_process")
        if fresh:
            print(
                f"{r['program']} {' '.join(r['args'])} (each in a fresh process, the cache warm): wasmtime "
                f"{fresh['wasmtime_seconds']:.3f} s, tensorwasm run {fresh['tensorwasm_seconds']:.3f} s "
                f"({fresh['wasmtime_seconds'] / fresh['tensorwasm_seconds']:.2f}x; Python start and imports included)"
            )
    for phase in ("cold", "warm"):
        for kind, names in KINDS.items():
            if kind == "declines":
                continue
            found = [r[phase]["speedup"] for r in rows if r["program"] in names]
            if found:
                print(
                    f"geometric mean speedup, {phase}, {kind} ({', '.join(names)}): "
                    f"{math.exp(sum(map(math.log, found)) / len(found)):.1f}x"
                )
    return 0


def measure(name: str, args: list[str], device: str, mode: str, simd: bool = False) -> dict:
    """One example program (the ``-msimd128`` build with ``simd``): plain wasmtime, then
    ``tensorwasm run`` cold and warm (the cache directory is the caller's)."""
    path = ROOT / f"examples/wasi/build/{name}.O2{'.simd' if simd else ''}.wasm"
    base_seconds, expected = plain(path, args)
    row = {"program": name, "args": args, "simd": simd, "wasmtime_seconds": base_seconds}
    for phase in ("cold", "warm"):
        default_cache().memory.clear()
        timings, output = offloaded(path, args, device, mode)
        total = timings["compile_seconds"] + timings["run_seconds"]
        row[phase] = {"identical_output": output == expected, "tensorwasm_seconds": total,
                      "speedup": base_seconds / total, **timings}  # fmt: skip
    if name in KINDS["declines"]:
        row["fresh_process"] = fresh_processes(path, args, device, mode)
    return row


def speedups(document: dict | list) -> dict[tuple[str, str], dict]:
    """Each program and size of a run's JSON, warm: ``{(program, size): {"speedup",
    "launches", "kernel_seconds", "identical"}}``. Takes this module's ``--json`` (a list of
    rows) and the suite's document (``python -m benchmarks``: its ``results``); the speedup
    is over the same build on wasmtime."""
    found = {}
    if isinstance(document, list):
        for row in document:
            warm = row["warm"]
            found[(row["program"], " ".join(row["args"]))] = {
                "speedup": warm["speedup"], "launches": warm["launches"],
                "kernel_seconds": warm["kernel_seconds"], "identical": warm["identical_output"],
            }  # fmt: skip
        return found
    for row in document["results"]:
        warm = row["tensorwasm"]["warm"]
        if "error" in warm:
            found[(row["program"], row["label"])] = {"error": warm["error"], "identical": False}
            continue
        found[(row["program"], row["label"])] = {
            "speedup": row["wasmtime"]["seconds"] / warm["seconds"], "launches": warm["launches"],
            "kernel_seconds": warm["kernel_seconds"], "identical": warm["identical_output"],
        }  # fmt: skip
    return found


# The target: a SIMD build's speedup within 10% of its scalar build's.
SIMD_TOLERANCE = 0.10


def simd_table(scalar: dict | list, simd: dict | list) -> list[str]:
    """A markdown table, one line per program and size of the scalar run: the scalar and the
    SIMD build's warm speedups over wasmtime, their ratio (SIMD / scalar), whether it is
    within :data:`SIMD_TOLERANCE`, the launches of each and whether both outputs were
    identical to wasmtime's; then how many are within."""
    ours, theirs = speedups(scalar), speedups(simd)
    lines = [
        "| program | size | scalar speedup | SIMD speedup | SIMD / scalar | within 10% | launches scalar / SIMD | identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    within = 0
    for (program, size), a in ours.items():
        b = theirs.get((program, size))
        if b is None or "error" in a or "error" in b:
            why = "no SIMD run" if b is None else (a.get("error") or b.get("error"))
            lines.append(f"| {program} | {size} | | | | no ({why}) | | |")
            continue
        ratio = b["speedup"] / a["speedup"]
        ok = abs(ratio - 1) <= SIMD_TOLERANCE
        within += ok
        lines.append(
            f"| {program} | {size} | {a['speedup']:.2f}x | {b['speedup']:.2f}x | {ratio:.2f} | "
            f"{'yes' if ok else 'no'} | {a['launches']} / {b['launches']} | "
            f"{'yes' if a['identical'] and b['identical'] else 'NO'} |"
        )
    lines += ["", f"{within} of {len(ours)} within {SIMD_TOLERANCE:.0%} of the scalar build's speedup"]
    return lines


# By arithmetic intensity: the work of a compute-bound program grows faster than its data
# (n^3 on n^2 numbers, n^2 on n); a bandwidth-bound one does a few operations per byte, so
# its kernels run at memory speed and its transfers weigh as much as they do.
# The program whose loops must stay on the CPU is also run in fresh processes: there
# tensorwasm's own start (Python imports, the CUDA context) shows.
KINDS = {
    "compute-bound": ("matmul", "nbody"),
    "bandwidth-bound": ("stencil", "blur"),
    "declines": ("histogram",),
}


def fresh_processes(path: Path, args: list[str], device: str, mode: str, rounds: int = 5) -> dict:
    """The best of ``rounds`` fresh processes each, interleaved: plain wasmtime, and
    ``tensorwasm run`` with the cache this benchmark filled (see :mod:`benchmarks.start`)."""
    found = start.interleaved(start.commands(path, args, [device], mode), rounds)
    return {
        "wasmtime_seconds": found["wasmtime"]["min"],
        "tensorwasm_seconds": found[f"tensorwasm {device}"]["min"],
    }


if __name__ == "__main__":
    sys.exit(main())
