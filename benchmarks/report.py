"""The benchmark report: ``python -m benchmarks.report RESULTS.json [--md FILE] [--img DIR]``.

Reads the JSON that ``python -m benchmarks`` wrote and writes ``docs/benchmarks.md``: where
the numbers were measured, the targets and where each stands, the copy bandwidth, the
end-to-end table (plain wasmtime against ``tensorwasm run``), the kernel table (TensorWasm's
kernels against nvcc, numba-cuda and CuPy), and two plots under ``docs/img/`` (time against
problem size; speedup over wasmtime). The plots need matplotlib (the ``bench`` extra); without
it the markdown is written alone and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from benchmarks.peers import KERNEL_PEERS
from benchmarks.programs import BANDWIDTH, COMPUTE, PROGRAMS, ROOT

MD_PATH = ROOT / "docs" / "benchmarks.md"
IMG_DIR = ROOT / "docs" / "img"
TIME_PLOT = "benchmarks-time.png"
SPEEDUP_PLOT = "benchmarks-speedup.png"
PEER_TITLES = {"nvcc": "nvcc", "numba-cuda": "numba-cuda", "cupy": "CuPy"}
COPY_TITLES = {
    "htod_pinned": "host to device, page-locked",
    "dtoh_pinned": "device to host, page-locked",
    "htod_pageable": "host to device, pageable",
    "dtoh_pageable": "device to host, pageable",
    "dtod": "device to device (read + write)",
    "host_register": "page-locking ordinary memory (cuMemHostRegister)",
}

# The targets of the suite: (name, the goal as text).
NONE = "-"  # a cell with no value

BANDWIDTH_FRACTION = 0.85
NVCC_RATIO = 1.25
SPEEDUP = 100.0
CUBLAS_FRACTION = 0.25
COMPILE_COLD = 0.020
COMPILE_WARM = 0.001


# -- reading the results ------------------------------------------------------------------------


def kernel_seconds(row: dict) -> tuple[float | None, str]:
    """TensorWasm's time for the program's kernel function (warm run): the CUDA-event device
    time where there is one, else the run's own wall-clock time around launches."""
    run = row["tensorwasm"].get("warm", {})
    kernel = run.get("kernel")
    if not kernel or not kernel.get("launches"):
        return None, "not offloaded"
    if kernel.get("device_seconds") is not None:
        return kernel["device_seconds"], "events"
    return kernel["kernel_seconds"], "wall"


def peer_seconds(row: dict, family: str) -> float | None:
    peer = row.get("peers", {}).get(family, {})
    return peer.get("seconds")


def largest(rows: list[dict]) -> dict[str, dict]:
    """The row of each program's largest size (the last one measured)."""
    chosen: dict[str, dict] = {}
    for row in rows:
        chosen[row["program"]] = row
    return chosen


def speedup(row: dict, phase: str = "warm") -> float | None:
    run = row["tensorwasm"].get(phase, {})
    if "seconds" not in run or not run["seconds"]:
        return None
    return row["wasmtime"]["seconds"] / run["seconds"]


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


# -- formatting ---------------------------------------------------------------------------------


def ms(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    value = seconds * 1e3
    if value >= 100 or value == 0:
        return f"{value:.0f}"
    return f"{value:.{max(0, 2 - math.floor(math.log10(value)))}f}"  # three significant digits


def secs(seconds: float | None) -> str:
    return NONE if seconds is None else ms(seconds * 1e-3)


def ratio(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def percent(value: float | None) -> str:
    return NONE if value is None else f"{value * 100:.0f}%"


def size_label(row: dict) -> str:
    """``n=2^26 reps=10``: powers of two past 2^15 as exponents."""
    parts = []
    for name, value in row["params"].items():
        exp = value.bit_length() - 1
        text = f"2^{exp}" if value >= 1 << 16 and value == 1 << exp else str(value)
        parts.append(f"{name}={text}")
    return " ".join(parts)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


# -- the sections -------------------------------------------------------------------------------


def environment_section(doc: dict) -> list[str]:
    env = doc["environment"]
    gpu = env.get("gpu")
    rows = []
    if gpu:
        rows.append(["GPU", f"{gpu['name']} (compute capability {gpu['compute_capability']}, "
                            f"{gpu['multiprocessors']} SMs, {gpu['memory_bytes'] / 2**30:.0f} GiB)"])  # fmt: skip
        rows.append(["driver", f"{gpu.get('driver') or '?'} (CUDA {gpu['cuda_driver_api']})"])
        rows.append(["nvcc", gpu.get("nvcc") or "not found"])
    else:
        rows.append(["GPU", f"none: tensorwasm ran on the host backend ({doc['device']})"])
    rows.append(["CPU", f"{env['cpu']} ({env['cpu_count']} cores)"])
    rows.append(["Python", f"{env['python']} on {env['platform']}"])
    packages = {name: version for name, version in env["packages"].items() if version}
    for peer in doc.get("peers", {}).values():
        for name, version in (peer.get("versions") or {}).items():
            if name in ("numba", "numba-cuda", "cupy", "cublas"):
                packages[name] = version
    rows.append(["packages", ", ".join(f"{name} {version}" for name, version in packages.items())])
    tw = env["tensorwasm"]
    rows.append(["tensorwasm", f"{tw['compiler_version']} (commit {tw.get('commit') or 'unknown'})"])
    rows.append(["run", f"{env['date']}, sizes `{doc['sizes']}`, offload `{doc['offload']}`, "
                        f"{doc['total_seconds']:.0f} s in all"])  # fmt: skip
    return ["## Where it ran", "", *table(["what", "value"], rows), ""]


def bandwidth_of(row: dict, doc: dict) -> tuple[float | None, float | None]:
    """(achieved GB/s, fraction of the device-to-device copy bandwidth) of TensorWasm's kernel."""
    seconds, _ = kernel_seconds(row)
    if seconds is None or not seconds:
        return None, None
    gbps = row["bytes"] / seconds / 1e9
    copy = (doc.get("bandwidth") or {}).get("dtod")
    return gbps, (gbps / copy if copy else None)


def targets_section(doc: dict) -> list[str]:
    rows = doc["results"]
    big = largest(rows)
    on_gpu = doc["device"] == "gpu"
    lines = []

    def status(ok: bool | None) -> str:
        if ok is None or not on_gpu:
            return "not measured" if not on_gpu else "no data"
        return "met" if ok else "not met"

    # Bandwidth-bound loops against the copy bandwidth.
    # Bandwidth-bound loops against the copy bandwidth; a loop left on the CPU misses it.
    fractions = {name: bandwidth_of(row, doc)[1] for name, row in big.items() if row["category"] == BANDWIDTH}
    text = ", ".join(f"{k} {percent(v)}" for k, v in fractions.items()) or NONE
    ok = all(v is not None and v >= BANDWIDTH_FRACTION for v in fractions.values()) if fractions else None
    lines.append([f"bandwidth-bound loops >= {BANDWIDTH_FRACTION:.0%} of measured copy bandwidth", text,
                  status(ok if doc.get("bandwidth") else None)])  # fmt: skip

    # Kernel time against the peers, where the peer has a time (None: TensorWasm has none).
    for family, limit, goal in (("nvcc", NVCC_RATIO, f"kernel time <= {NVCC_RATIO}x nvcc"),
                                ("numba-cuda", 1.0, "kernel time <= numba-cuda")):  # fmt: skip
        ratios: dict[str, float | None] = {}
        for name, row in big.items():
            tw, peer = kernel_seconds(row)[0], peer_seconds(row, family)
            if peer:
                ratios[name] = tw / peer if tw else None
        text = ", ".join(f"{k} {ratio(v)}" for k, v in ratios.items()) or NONE
        met = sum(v is not None and v <= limit for v in ratios.values())
        summary = f"{met} of {len(ratios)} programs; " if ratios else ""
        lines.append([goal, summary + text, status(met == len(ratios) if ratios else None)])

    # End to end against plain wasmtime.
    compute = {name: speedup(row) for name, row in big.items() if row["category"] == COMPUTE}
    mean = geomean([v for v in compute.values() if v])
    text = (f"geomean {ratio(mean)} (" + ", ".join(f"{k} {ratio(v)}" for k, v in compute.items()) + ")"
            if mean else NONE)  # fmt: skip
    large_gpu = on_gpu and doc["sizes"] == "large"
    lines.append([f"end to end >= {SPEEDUP:.0f}x plain wasmtime, geomean of compute-bound nests at large sizes",
                  text, status(mean >= SPEEDUP) if large_gpu and mean else "not measured"])  # fmt: skip

    # gemm against cuBLAS.
    gemm = big.get("gemm")
    fraction = None
    if gemm is not None:
        tw, cublas = kernel_seconds(gemm)[0], peer_seconds(gemm, "cupy")
        if tw and cublas:
            fraction = cublas / tw
    lines.append([f"gemm: fraction of cuBLAS throughput (long-term >= {CUBLAS_FRACTION:.0%})",
                  f"{percent(fraction)} at {size_label(gemm)}" if fraction is not None and gemm else NONE,
                  status(fraction >= CUBLAS_FRACTION if fraction is not None else None)])  # fmt: skip

    # Compile latency.
    for phase, limit in (("cold", COMPILE_COLD), ("warm", COMPILE_WARM)):
        values = [r["tensorwasm"][phase]["compile_seconds_per_kernel"] for r in rows
                  if "compile_seconds_per_kernel" in r["tensorwasm"].get(phase, {})]  # fmt: skip
        median = statistics.median(values) if values else None
        lines.append([f"compile to PTX <= {limit * 1e3:g} ms per kernel, {phase} cache",
                      f"median {ms(median)} ms per kernel" if median is not None else NONE,
                      status(median <= limit if median is not None else None)])  # fmt: skip

    identical = sum(r["identical_output"] for r in rows)
    lines.append(["output identical to plain wasmtime", f"{identical} of {len(rows)} runs",
                  "met" if identical == len(rows) else "not met"])  # fmt: skip
    out = ["## Targets", ""]
    if not on_gpu:
        out += [
            "This run had no GPU: the kernel targets are not measured here. Regenerate from a GPU run.",
            "",
        ]
    return [*out, *table(["target", "measured (largest size of each program)", "status"], lines), ""]


def bandwidth_section(doc: dict) -> list[str]:
    gbps = doc.get("bandwidth")
    out = ["## Copy bandwidth", ""]
    if not gbps:
        reason = doc.get("peers", {}).get("copy", {}).get("reason", "not measured")
        return [*out, f"Not measured: {reason}.", ""]
    rows = [[COPY_TITLES.get(k, k), f"{v:.1f}"] for k, v in gbps.items()]
    return [*out, "Measured in the same run with the driver layer (`cuMemcpy*`, CUDA events, median of 5).", "",
            *table(["copy", "GB/s"], rows), ""]  # fmt: skip


def end_to_end_section(doc: dict) -> list[str]:
    rows = []
    declines = []
    for row in doc["results"]:
        w = row["wasmtime"]
        cold, warm = row["tensorwasm"].get("cold", {}), row["tensorwasm"].get("warm", {})
        if "error" in warm or "error" in cold:
            failed = " ".join(str(warm.get("error") or cold.get("error")).split()[:24])  # one table line
            rows.append([row["program"], size_label(row), secs(w["seconds"]), "failed", "failed",
                         *[NONE] * 6, f"no: {failed}"])  # fmt: skip
            continue
        kernel = warm["kernel"]
        rows.append([
            row["program"], size_label(row), secs(w["seconds"]), secs(cold["seconds"]), secs(warm["seconds"]),
            ratio(speedup(row)), f"{ms(cold['compile_seconds'])} / {ms(warm['compile_seconds'])}",
            ms(warm["transfer_seconds"]), ms(warm["kernel_seconds"]), ms(warm["on_wasmtime_seconds"]),
            f"{kernel['launches']}/{kernel['arrivals']}", "yes" if row["identical_output"] else "**no**",
        ])  # fmt: skip
        if kernel["declined"]:
            why = "; ".join(f"{count}x {reason}" for reason, count in kernel["declined"].items())
            declines.append(f"- {row['program']} {size_label(row)}: {why}")
    header = ["program", "size", "wasmtime (s)", "tensorwasm cold (s)", "tensorwasm warm (s)", "speedup (warm)",
              "compile cold / warm (ms)", "transfers (ms)", "kernels (ms)", "on wasmtime (ms)",
              "kernel loop offloaded", "same output"]  # fmt: skip
    lines = [
        "## End to end: `tensorwasm run` against plain wasmtime",
        "",
        "Whole-program wall time in one process (wasmtime: module compile and run; tensorwasm: analysis, "
        "kernel compile, wasmtime compile and run). The warm run's time splits into compile, transfers "
        "between linear memory and the device, kernels (every offloaded loop, set-up loops included) and "
        'the rest on wasmtime. "Kernel loop offloaded" counts the arrivals at the loops of the program\'s '
        f"kernel function that ran as kernels. Device: `{doc['device']}`.",
        "",
        *table(header, rows),
        "",
    ]
    if declines:
        lines += ["Arrivals at kernel loops that stayed on wasmtime, and why (warm run):", "", *declines, ""]
    return lines


def kernel_section(doc: dict) -> list[str]:
    rows = []
    families = [f for f in KERNEL_PEERS if f in doc.get("peers", {})]
    for row in doc["results"]:
        tw, how = kernel_seconds(row)
        cells = [row["program"], size_label(row), ms(tw) + (" (wall)" if how == "wall" else "")]
        peer_times = [peer_seconds(row, f) for f in families]
        cells += [ms(t) for t in peer_times]
        cells += [ratio(tw / t) if tw and t else NONE for t in peer_times]
        if row["category"] == BANDWIDTH:
            gbps, fraction = bandwidth_of(row, doc)
            cells += [f"{gbps:.0f} GB/s" if gbps else NONE, percent(fraction)]
        else:
            gflops = row["flops"] / tw / 1e9 if tw else None
            cells += [f"{gflops:.0f} GFLOP/s" if gflops else NONE, ""]
        rows.append(cells)
    titles = [PEER_TITLES[f] for f in families]
    header = ["program", "size", "tensorwasm (ms)", *[f"{t} (ms)" for t in titles],
              *[f"vs {t}" for t in titles], "throughput", "of copy bandwidth"]  # fmt: skip
    return [
        "## Kernels: TensorWasm against its peers",
        "",
        "Device time of everything the program's kernel function does (all passes, all time steps), "
        "data already on the device. TensorWasm: CUDA events around each launch of the warm run "
        '(which include the few microseconds the host takes to submit a launch; "wall" marks the '
        "run's own clock where events were missing). Peers: CUDA events around the same work, median "
        "of 5 runs. \"vs\" is TensorWasm's time over the peer's (below 1: TensorWasm is faster). "
        "Throughput counts the bytes a perfect kernel moves (bandwidth-bound programs) or the "
        "floating-point operations (the nests); the copy bandwidth is the device-to-device figure.",
        "",
        *table(header, rows),
        "",
    ]


def peers_section(doc: dict) -> list[str]:
    lines = ["## Peers", ""]
    for family, peer in doc.get("peers", {}).items():
        title = PEER_TITLES.get(family, "copy bandwidth")
        state = peer.get("status")
        versions = ", ".join(f"{k} {v}" for k, v in (peer.get("versions") or {}).items())
        text = f"- **{title}**: {state}"
        if peer.get("reason"):
            text += f" ({peer['reason']})"
        if versions:
            text += f"; {versions}"
        checks = peer.get("checks") or {}
        failed = [f"{name} ({_check_failure(c)})" for name, c in checks.items() if c and not c.get("passed")]
        skipped = [name for name, c in checks.items() if c is None]
        if checks:
            text += f"; checked against NumPy at the small sizes: {len(checks) - len(failed) - len(skipped)} passed"
            if failed:
                text += ", failed: " + ", ".join(failed)
        lines.append(text)
    same = {}
    for family in KERNEL_PEERS:
        results = [r["peers"].get(family, {}) for r in doc["results"]]
        compared = [p for p in results if "identical_output" in p]
        if compared:
            same[family] = f"{sum(p['identical_output'] for p in compared)} of {len(compared)}"
    if same:
        lines += ["", "Peer outputs printed as the Wasm program prints them, identical to wasmtime's: "
                  + ", ".join(f"{PEER_TITLES[f]} {v}" for f, v in same.items())
                  + " (nvcc is built without fused multiply-add, as Wasm rounds; numba-cuda and CuPy "
                  "may fuse, and cuBLAS sums in its own order)."]  # fmt: skip
    # A peer that failed as a whole is said above; list the failures of peers that ran.
    running = {family for family, peer in doc.get("peers", {}).items() if peer.get("status") == "ok"}
    errors = [f"{r['program']} {size_label(r)} {PEER_TITLES[f]}: {p['error']}"
              for r in doc["results"] for f, p in r.get("peers", {}).items() if "error" in p and f in running]  # fmt: skip
    if errors:
        lines += ["", "Failures:", "", *[f"- {e}" for e in errors]]
    return [*lines, ""]


def _check_failure(check: dict) -> str:
    if "error" in check:
        return check["error"]
    return f"relative error {check.get('max_error', 0):.1e}"


def programs_section() -> list[str]:
    rows = [[f"`{p.name}`", p.summary, p.category, " ".join(p.params)] for p in PROGRAMS.values()]
    return [
        "## The programs",
        "",
        "C sources under `benchmarks/suite/` (built by `benchmarks/suite/build.sh`, clang-16 -O2, wasi-libc); "
        "each prints a checksum. `dot` runs with `--relaxed-float`: its values are small integers, so "
        "every summation order gives the same bits.",
        "",
        *table(["program", "kernel", "bound by", "arguments"], rows),
        "",
    ]


def method_section(doc: dict) -> list[str]:
    startup = doc.get("startup", {})
    context = startup.get("cuda_context_seconds")
    once = f"creating the CUDA context took {ms(context)} ms; " if context is not None else ""
    nbytes = doc.get("peers", {}).get("copy", {}).get("bytes")
    copied = f"{nbytes / 2**20:.0f} MiB" if nbytes else "512 MiB at the large sizes"
    return [
        "## How the numbers are taken",
        "",
        "- Run: `benchmarks/suite/build.sh` (only after changing a program), then "
        "`python -m benchmarks --sizes large --out out/benchmarks` on a GPU machine, then "
        "`python -m benchmarks.report out/benchmarks/benchmarks-large-gpu.json` (needs the `bench` extra "
        "for the plots).",
        "- wasmtime: wasmtime-py with WASI, the module compiled and run in the benchmark's process.",
        f"- tensorwasm: `tensorwasm run` in the same process, offload mode `{doc['offload']}`; cold: an empty "
        "compiled-code cache directory; warm: the same directory again, read from disk as a new process "
        "would. The interpreter's start and one-time costs are outside the times ("
        f"{once}one uncounted compile warmed the compiler up: {ms(startup.get('warmup_seconds'))} ms).",
        "- Compile per kernel: the module's compile time (analysis, outlining, lowering, PTX or object "
        "code, loading) over the number of loops it compiles, libc's loops included.",
        "- Kernel times: see the kernel table. Peers run each in a process of their own; nvcc builds "
        "`benchmarks/peers/kernels.cu` with `-O3 -fmad=false` and runs it through `runtime.driver`; "
        "every peer is checked against NumPy at the small size of each program before it is timed.",
        f"- Copy bandwidth: `cuMemcpy*` through `runtime.driver`, {copied} per copy.",
        "",
    ]


def render(doc: dict, plots: list[str] | None, source: str) -> str:
    lines = [
        "# Benchmarks: TensorWasm against wasmtime, nvcc, numba-cuda and CuPy",
        "",
        f"Generated by `python -m benchmarks.report {source}` from `python -m benchmarks --sizes "
        f"{doc['sizes']}` (device `{doc['device']}`). Regenerate: run the suite on a GPU machine, "
        "then the report here.",
        "",
    ]
    lines += environment_section(doc)
    lines += targets_section(doc)
    lines += bandwidth_section(doc)
    lines += end_to_end_section(doc)
    lines += kernel_section(doc)
    lines += peers_section(doc)
    lines += ["## Plots", ""]
    if plots:
        lines += [f"![{name}](img/{name})" for name in plots] + [""]
    else:
        lines += ["Not drawn: matplotlib is not installed (`pip install -e '.[bench]'`).", ""]
    lines += method_section(doc)
    lines += programs_section()
    return "\n".join(lines).rstrip() + "\n"


# -- plots --------------------------------------------------------------------------------------


def plot(doc: dict, img_dir: Path) -> list[str] | None:
    """Draw the two plots; None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    by_program: dict[str, list[dict]] = {}
    for row in doc["results"]:
        by_program.setdefault(row["program"], []).append(row)
    metadata = {"Software": None}  # keeps the PNG free of the matplotlib version

    names = list(by_program)
    cols = 4
    fig, axes = plt.subplots(
        -(-len(names) // cols), cols, figsize=(16, 4 * -(-len(names) // cols)), squeeze=False
    )
    series = [("wasmtime (end to end)", lambda r: r["wasmtime"]["seconds"], "o-"),
              ("tensorwasm (end to end, warm)", lambda r: r["tensorwasm"].get("warm", {}).get("seconds"), "s-"),
              ("tensorwasm kernels", lambda r: kernel_seconds(r)[0], "^-")]  # fmt: skip
    series += [
        (f"{PEER_TITLES[f]} kernels", (lambda r, f=f: peer_seconds(r, f)), "v--") for f in KERNEL_PEERS
    ]
    for ax, name in zip(axes.flat, names, strict=False):
        rows = by_program[name]
        xs = [r["params"]["n"] for r in rows]
        for label, value, style in series:
            points = [(x, value(r)) for x, r in zip(xs, rows, strict=True) if value(r)]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name}: {PROGRAMS[name].summary}" if name in PROGRAMS else name, fontsize="small")
        ax.set_xlabel("n")
        ax.set_ylabel("seconds")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels))
    fig.suptitle(f"Time against problem size (device {doc['device']}, sizes {doc['sizes']})")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(img_dir / TIME_PLOT, dpi=90, metadata=metadata)
    plt.close(fig)

    rows = [r for r in doc["results"] if speedup(r)]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows) + 2), 5.5))
    colors = {BANDWIDTH: "tab:blue", COMPUTE: "tab:orange"}
    bars = ax.bar(range(len(rows)), [speedup(r) for r in rows], color=[colors[r["category"]] for r in rows])
    for bar, r in zip(bars, rows, strict=True):
        if not r["identical_output"]:  # not a valid result: hatched, and said in the legend
            bar.set_hatch("xx")
            bar.set_alpha(0.45)
    ax.set_xticks(range(len(rows)), [f"{r['program']}\n{size_label(r)}" for r in rows], rotation=60,
                  ha="right", fontsize="x-small")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhline(SPEEDUP, color="red", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylabel("wasmtime time / tensorwasm time (warm cache)")
    ax.set_title(f"End-to-end speedup over plain wasmtime (device {doc['device']}, sizes {doc['sizes']})")
    ax.grid(True, axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(plt.Line2D([], [], color="red", linestyle=":"))
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="grey", hatch="xx"))
    ax.legend(handles, ["bandwidth-bound", "compute-bound nest", f"target {SPEEDUP:.0f}x (compute-bound)",
                        "output differs from wasmtime's (not a result)"], fontsize="small")  # fmt: skip
    fig.tight_layout()
    fig.savefig(img_dir / SPEEDUP_PLOT, dpi=90, metadata=metadata)
    plt.close(fig)
    return [TIME_PLOT, SPEEDUP_PLOT]


def kept_sections(md_path: Path) -> str:
    """The sections other benchmarks write into the same file, each between its own
    ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers: kept, in order, after the
    rendered report."""
    try:
        text = md_path.read_text()
    except OSError:
        return ""
    pattern = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
    return "".join(f"\n{m.group(0)}\n" for m in pattern.finditer(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("results", type=Path, help="JSON written by python -m benchmarks")
    parser.add_argument("--md", type=Path, default=MD_PATH, help=f"markdown to write (default {MD_PATH})")
    parser.add_argument(
        "--img", type=Path, default=IMG_DIR, help=f"directory for the plots (default {IMG_DIR})"
    )
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        print(f"benchmarks.report: cannot read {args.results}: {exc}", file=sys.stderr)
        return 2
    plots = plot(doc, args.img)
    if plots is None:
        print(
            "benchmarks.report: matplotlib is not installed; writing the markdown without plots",
            file=sys.stderr,
        )
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(render(doc, plots, args.results.name) + kept_sections(args.md))
    print(f"wrote {args.md}" + (f" and {', '.join(str(args.img / p) for p in plots)}" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
