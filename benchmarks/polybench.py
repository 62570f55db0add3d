"""PolyBench/C 4.2.1 on ``tensorwasm run`` against plain wasmtime: ``python -m benchmarks.polybench``.

The detector is judged on code nobody here wrote. This builds the suite's 30 programs from
an unmodified PolyBench/C 4.2.1 tree (``--src``; the project does not copy it) with
clang-16 for wasm32-wasi, and runs each in a process of its own, under plain wasmtime and
under ``tensorwasm run --device D``:

- the builds define ``POLYBENCH_TIME`` (the kernel's time, PolyBench's own timer, printed
  first) and ``POLYBENCH_DUMP_ARRAYS``, with every ``fprintf`` sent through a compiled-in
  shim (``polybench-support/dump.c``) that writes each floating-point element as the hex
  digits of its bits instead of PolyBench's two decimals, and the dump to stdout: the
  outputs after the time line are compared byte for byte;
- the package's bytecode is compiled first, as installing it does (a checkout run with
  ``PYTHONDONTWRITEBYTECODE`` would compile every module from source in every process);
- each program runs once untimed under both (compiled code cached: wasmtime's own cache,
  tensorwasm's), tensorwasm ``--warmup`` times in all (default 2: a run decides from what
  its module's last runs on this machine did whether to start the CUDA context with the
  program and which host kernels to load early, so the second warm run is the first of
  the steady state), then ``--repeat`` times each, alternating; the median of the kernel
  times and of the whole process times is kept. A short program runs more times
  (``--short-seconds``: as many as fit in that many seconds by its untimed runs, at most
  :data:`SHORT_REPEAT`): a process of 0.1 to 0.3 s varies by tens of milliseconds from
  one run to the next, more than the 5% a comparison has to tell;
- tensorwasm's JSON report gives the loops the analysis accepted (candidates), those that
  launched at least once, and why arrivals declined.

It writes ``build/polybench/polybench-<dataset>-<device>.json``, the markdown table, and
with ``--docs`` the PolyBench section of ``docs/benchmarks.md`` (between its markers) and
its plot, drawn by :func:`svg_plot` into ``docs/img/`` (an SVG: no plotting library), and
the JSON both come from into ``docs/data/``. ``--from-json FILE --docs`` writes the section
and the plot again from a JSON this command wrote, running nothing; given several (the parts
of one sitting, each run in a device command of its own with ``--only``), it merges them
(:func:`merged`: one settings and one commit, each program once) and writes the merged JSON
to ``--out``. The commit recorded is ``git describe --dirty``'s (``benchmarks.source_commit``):
a tree whose files are not its HEAD's says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import source_commit

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "benchmarks" / "polybench-support"
SHIM = SUPPORT / "dump.c"
DEFAULT_SRC = ROOT.parent / "shared" / "polybench-4.2.1"
BUILD = ROOT / "build" / "polybench"
MD_PATH = ROOT / "docs" / "benchmarks.md"
IMG_DIR = ROOT / "docs" / "img"
PLOT = "polybench-speedup"  # docs/img/<PLOT>-<dataset>-<device>.svg
DATASETS = ("MINI", "SMALL", "MEDIUM", "LARGE", "EXTRALARGE")
BEGIN, END = "<!-- polybench:begin -->", "<!-- polybench:end -->"
SCHEMA = 1

CLANG = "clang-16"
CFLAGS = ["--target=wasm32-wasi", "-O2", "-DPOLYBENCH_TIME", "-DPOLYBENCH_DUMP_ARRAYS",
          "-D_WASI_EMULATED_PROCESS_CLOCKS", "-Dfprintf=tw_fprintf"]  # fmt: skip
LIBS = ["-lwasi-emulated-process-clocks", "-lm"]

# Plain wasmtime, in a process of its own: the program with its stdio inherited, its
# compiled code in wasmtime's own cache (as tensorwasm's is in its cache).
PLAIN = """
import sys, wasmtime
config = wasmtime.Config()
config.cache = True
engine = wasmtime.Engine(config)
store = wasmtime.Store(engine)
linker = wasmtime.Linker(engine)
linker.define_wasi()
wasi = wasmtime.WasiConfig()
wasi.argv = [sys.argv[1]]
wasi.inherit_stdout()
wasi.inherit_stderr()
store.set_wasi(wasi)
instance = linker.instantiate(store, wasmtime.Module.from_file(engine, sys.argv[1]))
try:
    instance.exports(store)["_start"](store)
except wasmtime.ExitTrap as exc:
    sys.exit(exc.code)
"""


def programs(src: Path) -> dict[str, Path]:
    """The suite's programs by name: their C files, as ``utilities/benchmark_list`` lists them."""
    listed = (src / "utilities" / "benchmark_list").read_text().split()
    return {Path(line).stem: src / line for line in listed}


def build(src: Path, source: Path, dataset: str, out_dir: Path) -> Path:
    """``source`` built for wasm32-wasi with the chosen dataset (kept while up to date)."""
    out = out_dir / dataset.lower() / f"{source.stem}.wasm"
    inputs = [source, source.with_suffix(".h"), src / "utilities" / "polybench.c", SHIM]
    if out.exists() and out.stat().st_mtime >= max(p.stat().st_mtime for p in inputs if p.exists()):
        return out
    if shutil.which(CLANG) is None:
        raise RuntimeError(f"{source.stem}: {CLANG} is not installed (and no current build at {out})")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [CLANG, *CFLAGS, f"-D{dataset}_DATASET", "-I", str(src / "utilities"), "-I", str(source.parent),
               str(src / "utilities" / "polybench.c"), str(source), str(SHIM), *LIBS, "-o", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{source.stem}: clang failed:\n{done.stderr}\n{' '.join(command)}")
    return out


def split_output(stdout: str) -> tuple[float | None, str]:
    """PolyBench's kernel time (its first line) and the dump after it."""
    first, _, rest = stdout.partition("\n")
    try:
        return float(first), rest
    except ValueError:
        return None, stdout


# The folders of the installed package: a wheel's install compiles their bytecode, as
# wasmtime's was; a checkout run with PYTHONDONTWRITEBYTECODE (or read-only) compiles every
# module from source in every process (~100 ms a run on a 2-core Xeon), which is no part of
# what ``tensorwasm run`` costs.
PACKAGE_DIRS = ("tensorwasm", "dialect", "compiler", "runtime")


def compile_bytecode(root: Path = ROOT) -> bool:
    """Write the package's bytecode where an install would have it (``__pycache__``, ignored
    by git), so each timed process reads it as an installed tensorwasm does; whether every
    module compiled."""
    import compileall

    return all(compileall.compile_dir(root / d, quiet=2) for d in PACKAGE_DIRS)


def _timed(command: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    return done, time.perf_counter() - start


def run_plain(wasm: Path, timeout: float) -> dict:
    """One run under plain wasmtime: status, kernel and process seconds, the dump."""
    done, seconds = _timed([sys.executable, "-c", PLAIN, str(wasm)], timeout)
    kernel, dump = split_output(done.stdout)
    return {
        "status": done.returncode,
        "kernel": kernel,
        "process": seconds,
        "dump": dump,
        "stderr": done.stderr,
    }


def run_tensorwasm(wasm: Path, device: str, offload: str, timeout: float) -> dict:
    """One run under ``tensorwasm run``: as :func:`run_plain`, with its JSON report."""
    command = [sys.executable, "-m", "tensorwasm", "run", "--device", device, "--offload", offload,
               "--report", "json", str(wasm)]  # fmt: skip
    done, seconds = _timed(command, timeout)
    kernel, dump = split_output(done.stdout)
    report, other = None, []
    for line in done.stderr.splitlines():
        if line.startswith('{"device"'):
            report = json.loads(line)
        else:
            other.append(line)
    return {"status": done.returncode, "kernel": kernel, "process": seconds, "dump": dump,
            "report": report, "stderr": "\n".join(other)}  # fmt: skip


def loop_summary(report: dict | None) -> dict:
    """From tensorwasm's report: candidates (loops the analysis accepts), those launched at
    least once, arrivals, launches, the decline reasons and the analysis's reasons for the
    loops it rejects (counted)."""
    if report is None:
        return {"candidates": 0, "launched": 0, "arrivals": 0, "launches": 0, "on_host": 0, "declined": {}, "rejected": {},
                "kernel_seconds": 0.0, "transfer_seconds": 0.0}  # fmt: skip
    loops = report["loops"]
    candidates = [row for row in loops if row["verdict"] == "offload"]
    declined: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for row in candidates:
        for why, n in (row["declined"] or {}).items():
            declined[why] = declined.get(why, 0) + n
    for row in loops:
        if row["verdict"] != "offload":
            rejected[_reason_kind(row["reason"])] = rejected.get(_reason_kind(row["reason"]), 0) + 1
    return {
        "candidates": len(candidates),
        "launched": sum(1 for row in candidates if row["offloaded"]),
        "arrivals": sum(row["arrivals"] for row in candidates),
        "launches": sum(row["offloaded"] for row in candidates),
        "on_host": sum(
            row.get("on_host", 0) for row in candidates
        ),  # of them: on the host while the GPU started
        "declined": declined,
        "rejected": rejected,
        "kernel_seconds": sum(row["kernel_seconds"] for row in candidates),
        "transfer_seconds": sum(row["transfer_seconds"] for row in candidates),
    }


def _reason_kind(reason: str) -> str:
    """A rejection reason without its offsets and operands (so they group across programs)."""
    words = []
    for word in reason.split():
        if word.startswith("+0x") or word.startswith("(+0x") or word[:1].isdigit():
            word = "N"
        words.append(word)
    return " ".join(words)


# The most timed runs of a short program (see measure's ``short_seconds``).
SHORT_REPEAT = 9


def measure(name: str, wasm: Path, device: str, offload: str, repeat: int, timeout: float,
            short_seconds: float = 0.0, warmup: int = 1) -> dict:  # fmt: skip
    """Warm both (tensorwasm with ``warmup`` untimed runs), then ``repeat`` runs of each,
    alternating; medians and the comparison. A program whose untimed runs (wasmtime's and
    tensorwasm's last) took less than ``short_seconds`` together runs as many more times as
    fit in them, at most :data:`SHORT_REPEAT`."""
    for _ in range(warmup - 1):
        run_tensorwasm(wasm, device, offload, timeout)
    took = run_plain(wasm, timeout)["process"] + run_tensorwasm(wasm, device, offload, timeout)["process"]
    if short_seconds > 0 and took > 0:
        repeat = max(repeat, min(SHORT_REPEAT, int(short_seconds / took)))
    plain, tw = [], []
    for _ in range(repeat):
        plain.append(run_plain(wasm, timeout))
        tw.append(run_tensorwasm(wasm, device, offload, timeout))
    reference = plain[0]
    identical = all(r["status"] == 0 and r["dump"] == reference["dump"] and r["dump"] for r in plain + tw)
    row = {
        "program": name,
        "identical_output": identical,
        "dump_bytes": len(reference["dump"]),
        "wasmtime": _medians(plain),
        "tensorwasm": _medians(tw),
        "loops": loop_summary(tw[-1]["report"]),
    }
    failed = [r for r in plain + tw if r["status"] != 0]
    if failed:
        row["error"] = failed[0]["stderr"].strip().splitlines()[-1:] or [f"exit status {failed[0]['status']}"]
    w, t = row["wasmtime"], row["tensorwasm"]
    row["kernel_speedup"] = w["kernel"] / t["kernel"] if w["kernel"] and t["kernel"] else None
    row["process_speedup"] = w["process"] / t["process"]
    return row


def _medians(runs: list[dict]) -> dict:
    kernels = [r["kernel"] for r in runs if r["kernel"] is not None]
    return {
        "kernel": statistics.median(kernels) if kernels else None,
        "process": statistics.median(r["process"] for r in runs),
        "kernels": kernels,
        "processes": [r["process"] for r in runs],
        "status": max((r["status"] for r in runs), key=abs),
    }


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: list[dict]) -> dict:
    kernel = [r["kernel_speedup"] for r in rows if r["kernel_speedup"]]
    process = [r["process_speedup"] for r in rows]
    return {
        "identical": sum(r["identical_output"] for r in rows),
        "programs": len(rows),
        "kernel_geomean": geomean(kernel),
        "process_geomean": geomean(process),
        "slower_than_1_05": sum(1 for s in process if s < 1 / 1.05),
        "launched": sum(r["loops"]["launched"] for r in rows),
        "candidates": sum(r["loops"]["candidates"] for r in rows),
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def markdown(doc: dict, plot: str | None) -> str:
    """The PolyBench section of docs/benchmarks.md."""
    s = doc["summary"]
    env = doc["environment"]
    lines = [
        BEGIN,
        "## PolyBench/C 4.2.1",
        "",
        f"`python -m benchmarks.polybench --dataset {doc['dataset']} --device {doc['device']} "
        f"--offload {doc['offload']} --repeat {doc['repeat']}"
        + (f" --warmup {doc['warmup']}" if doc.get("warmup") else "")
        + (f" --short-seconds {doc['short_seconds']:g}" if doc.get("short_seconds") else "")
        + "` on "
        f"{env['gpu'] + ' host, ' if env.get('gpu') else ''}{env['cpu']} ({env['cpu_count']} cores), "
        f"{env['date']}, commit {env['commit']}: each program built with clang-16 `-O2` for wasm32-wasi, run "
        "in a process of its own under plain wasmtime and under `tensorwasm run` (compiled code cached for "
        "both, medians). Kernel: PolyBench's own timer around the kernel. Process: the whole process, "
        "interpreter start included. Outputs: the live-out arrays dumped with every bit (hex), compared byte "
        "for byte. Loops: candidates the analysis accepts, launched at least once.",
        "",
        f"Outputs identical: {s['identical']}/{s['programs']}. Kernel-time geomean {_x(s['kernel_geomean'])}, "
        f"process geomean {_x(s['process_geomean'])}; {s['slower_than_1_05']} program(s) more than 5% slower "
        f"end to end; {s['launched']} of {s['candidates']} candidate loops launched.",
        "",
        "| program | identical | wasmtime kernel ms | tensorwasm kernel ms | kernel speedup | wasmtime process ms "
        "| tensorwasm process ms | process speedup | loops launched / candidates | arrivals / launches | declined |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in doc["results"]:
        loops = r["loops"]
        declined = "; ".join(f"{n}x {why}" for why, n in loops["declined"].items()) or "-"
        lines.append(
            f"| {r['program']} | {'yes' if r['identical_output'] else '**no**'} | {_ms(r['wasmtime']['kernel'])} "
            f"| {_ms(r['tensorwasm']['kernel'])} | {_x(r['kernel_speedup'])} | {_ms(r['wasmtime']['process'])} "
            f"| {_ms(r['tensorwasm']['process'])} | {_x(r['process_speedup'])} "
            f"| {loops['launched']} / {loops['candidates']} | {loops['arrivals']} / {loops['launches']}"
            + (f" ({loops['on_host']} on the host)" if loops.get("on_host") else "")
            + f" | {declined} |"
        )
    lines.append("")
    if plot is not None:
        lines += [
            f"[![PolyBench speedups per program, kernel and whole process, log scale](img/{plot})](img/{plot})",
            "",
            f"The plot: wasmtime's time over tensorwasm's per program, log scale (a bar below 1x is a loss); "
            f"the data: [`docs/data/{data_name(doc)}`](data/{data_name(doc)}).",
            "",
        ]
    lines.append(END)
    return "\n".join(lines) + "\n"


def data_name(doc: dict) -> str:
    """The file name of ``doc``'s JSON under docs/data."""
    return f"polybench-{doc['dataset'].lower()}-{doc['device']}.json"


def write_docs(doc: dict, md_path: Path, img_dir: Path, data_dir: Path | None = None) -> str:
    """The section into ``md_path`` (replacing the one between the markers, else appended),
    the plot into ``img_dir`` and the JSON into ``data_dir`` (by default docs/data beside
    ``md_path``); the plot's file name."""
    data_dir = data_dir or md_path.parent / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / data_name(doc)).write_text(json.dumps(doc, indent=1) + "\n")
    plot = draw(doc, img_dir)
    section = markdown(doc, plot)
    text = md_path.read_text() if md_path.exists() else ""
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    md_path.write_text(text)
    return plot


# The plot: two bars per program (kernel, whole process), on a log scale around 1x.
SVG_BAR, SVG_GAP, SVG_LEFT, SVG_TOP, SVG_HEIGHT, SVG_BOTTOM = 9, 10, 64, 44, 260, 96
SVG_SERIES = (("kernel_speedup", "kernel (PolyBench timer)", "#3b6fb6"),
              ("process_speedup", "whole process", "#e08a2c"))  # fmt: skip


def svg_plot(doc: dict) -> str:
    """The speedups of ``doc`` (the JSON this command writes) per program, kernel and end to
    end, as an SVG bar chart on a log scale: a bar rises from 1x for a gain and falls below it
    for a loss. Plain SVG text, the same for the same JSON."""
    from xml.sax.saxutils import escape

    rows = doc["results"]
    values = [r[key] for r in rows for key, _, _ in SVG_SERIES if r.get(key)]
    low = math.floor(math.log10(min([0.5, *values])))
    high = math.ceil(math.log10(max([2.0, *values])))
    width = max(640, SVG_LEFT + len(rows) * (2 * SVG_BAR + SVG_GAP) + 24)  # (the title fits)
    height = SVG_TOP + SVG_HEIGHT + SVG_BOTTOM

    def y(value: float) -> float:
        return SVG_TOP + SVG_HEIGHT * (high - math.log10(value)) / (high - low)

    title = f"PolyBench/C 4.2.1 {doc['dataset']}, device {doc['device']}, offload {doc['offload']}: " \
            "wasmtime time / tensorwasm time"  # fmt: skip
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{SVG_LEFT}" y="18" font-size="13">{escape(title)}</text>',
    ]
    for k, (_, label, color) in enumerate(SVG_SERIES):
        at = SVG_LEFT + 220 * k
        out.append(f'<rect x="{at}" y="26" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{at + 14}" y="35">{escape(label)}</text>')
    right = width - 24
    for exponent in range(low, high + 1):
        at = y(10.0**exponent)
        label = f"{10.0**exponent:g}x"
        stroke = "#444" if exponent == 0 else "#ddd"
        out.append(f'<line x1="{SVG_LEFT}" y1="{at:.1f}" x2="{right}" y2="{at:.1f}" stroke="{stroke}"/>')
        out.append(f'<text x="{SVG_LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">{label}</text>')
    one = y(1.0)
    for i, row in enumerate(rows):
        left = SVG_LEFT + SVG_GAP / 2 + i * (2 * SVG_BAR + SVG_GAP)
        for k, (key, label, color) in enumerate(SVG_SERIES):
            value = row.get(key)
            if not value:
                continue
            top, bottom = sorted((y(value), one))
            out.append(
                f'<rect x="{left + k * SVG_BAR:.1f}" y="{top:.1f}" width="{SVG_BAR}" '
                f'height="{max(bottom - top, 0.5):.1f}" fill="{color}">'
                f"<title>{escape(row['program'])}, {escape(label)}: {value:.3g}x</title></rect>"
            )
        x, base = left + SVG_BAR, SVG_TOP + SVG_HEIGHT + 8
        out.append(
            f'<text x="{x:.1f}" y="{base}" text-anchor="end" transform="rotate(-60 {x:.1f} {base})">'
            f"{escape(row['program'])}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw(doc: dict, img_dir: Path) -> str:
    """The plot of ``doc`` written into ``img_dir``; its file name."""
    img_dir.mkdir(parents=True, exist_ok=True)
    name = f"{PLOT}-{doc['dataset'].lower()}-{doc['device']}.svg"
    (img_dir / name).write_text(svg_plot(doc))
    return name


def environment() -> dict:
    import datetime
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = source_commit()
    gpu = None
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True)  # fmt: skip
        gpu = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cpu": cpu,
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "commit": commit,
            "gpu": gpu}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.polybench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC, help="the PolyBench/C 4.2.1 tree")
    parser.add_argument("--dataset", default="LARGE", type=str.upper, choices=DATASETS)
    parser.add_argument("--device", default="auto", choices=("cpu", "gpu", "auto"))
    parser.add_argument("--offload", default="auto", choices=("auto", "always", "off"))
    parser.add_argument("--only", help="NAME,... of the programs to run (default: all 30)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (medians)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed runs of tensorwasm first (its runs learn from the last ones on this machine)")  # fmt: skip
    parser.add_argument("--short-seconds", type=float, default=5.0,
                        help="a program whose untimed runs take less runs as many more times as fit in this "
                             f"many seconds (at most {SHORT_REPEAT}; 0: never)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=BUILD, help=f"builds and results (default {BUILD})")
    parser.add_argument("--build-only", action="store_true", help="build the programs, run nothing")
    parser.add_argument(
        "--docs", action="store_true", help="write the section of docs/benchmarks.md and the plot"
    )
    parser.add_argument("--from-json", type=Path, metavar="FILE", nargs="+",
                        help="run nothing: write the docs (with --docs) from a JSON this command wrote, or "
                             "from several, merged (a program's later row replaces an earlier one; the "
                             "merged JSON goes to --out)")  # fmt: skip
    parser.add_argument("--md", type=Path, default=MD_PATH, help=argparse.SUPPRESS)
    parser.add_argument("--img", type=Path, default=IMG_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.from_json is not None:
        return _from_json(args)
    if not (args.src / "utilities" / "benchmark_list").exists():
        print(f"benchmarks.polybench: no PolyBench/C tree at {args.src} (--src)", file=sys.stderr)
        return 2
    suite = programs(args.src)
    names = list(suite) if not args.only else args.only.split(",")
    unknown = [n for n in names if n not in suite]
    if unknown:
        print(f"benchmarks.polybench: unknown program(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        built = {name: build(args.src, suite[name], args.dataset, args.out) for name in names}
    except RuntimeError as exc:
        print(f"benchmarks.polybench: {exc}", file=sys.stderr)
        return 2
    if args.build_only:
        print(f"built {len(built)} program(s) under {args.out / args.dataset.lower()}")
        return 0
    if not compile_bytecode():
        print("benchmarks.polybench: the package's bytecode could not all be written", file=sys.stderr)
    rows = []
    for name, wasm in built.items():
        row = measure(
            name, wasm, args.device, args.offload, max(1, args.repeat), args.timeout, args.short_seconds,
            max(1, args.warmup),
        )  # fmt: skip
        rows.append(row)
        loops = row["loops"]
        print(f"{name:16} identical={row['identical_output']!s:5} kernel {_ms(row['wasmtime']['kernel'])} -> "
              f"{_ms(row['tensorwasm']['kernel'])} ms ({_x(row['kernel_speedup'])}), process "
              f"{_ms(row['wasmtime']['process'])} -> {_ms(row['tensorwasm']['process'])} ms "
              f"({_x(row['process_speedup'])}), loops {loops['launched']}/{loops['candidates']}", flush=True)  # fmt: skip
    doc = {"schema": SCHEMA, "dataset": args.dataset, "device": args.device, "offload": args.offload,
           "repeat": args.repeat, "warmup": args.warmup, "short_seconds": args.short_seconds,
           "environment": environment(),
           "results": rows, "summary": summary(rows)}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"polybench-{args.dataset.lower()}-{args.device}"
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(doc, None))
    s = doc["summary"]
    print(f"identical {s['identical']}/{s['programs']}; kernel geomean {_x(s['kernel_geomean'])}, process "
          f"geomean {_x(s['process_geomean'])}; {s['launched']}/{s['candidates']} loops launched; "
          f"wrote {args.out / stem}.json")  # fmt: skip
    if args.docs:
        plot = write_docs(doc, args.md, args.img)
        print(f"wrote {args.md}, {args.img / plot} and {args.md.parent / 'data' / data_name(doc)}")
    return 0 if all(r["identical_output"] for r in rows) else 1


def _from_json(args: argparse.Namespace) -> int:
    """``--from-json``: the docs written again from the JSON of an earlier run, or of several
    runs merged (one sitting run in parts, each a command of its own)."""
    docs = []
    for path in args.from_json:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"benchmarks.polybench: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            print(f"benchmarks.polybench: {path} is not a results file of schema {SCHEMA}", file=sys.stderr)
            return 2
        docs.append(doc)
    try:
        doc = merged(docs)
    except ValueError as exc:
        print(f"benchmarks.polybench: {exc}", file=sys.stderr)
        return 2
    if len(docs) > 1:
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"polybench-{doc['dataset'].lower()}-{doc['device']}-merged.json"
        out.write_text(json.dumps(doc, indent=1))
        print(f"merged {len(doc['results'])} programs from {len(docs)} files into {out}", file=sys.stderr)
    if not args.docs:
        print(markdown(doc, None), end="")
        return 0
    plot = write_docs(doc, args.md, args.img)
    print(f"wrote {args.md} and {args.img / plot} from {', '.join(map(str, args.from_json))}")
    return 0


# What parts of one sitting must share to be merged.
SITTING_KEYS = ("dataset", "device", "offload", "repeat", "warmup", "short_seconds")


def merged(docs: list[dict]) -> dict:
    """One results document from ``docs``, the parts of one sitting: the first's settings and
    environment, every program's row (a later part's row for a program replaces an earlier
    one's), the summary over them all. ValueError where the parts' settings differ or their
    commits do (their numbers are not of one tree)."""
    first = docs[0]
    if len(docs) == 1:
        return first
    ours = _sitting(first)
    for doc in docs[1:]:
        theirs = _sitting(doc)
        for key, value in ours.items():
            if theirs[key] != value:
                raise ValueError(
                    f"cannot merge parts whose {key} differs ({value!r} against {theirs[key]!r})"
                )
    rows: dict[str, dict] = {}
    for doc in docs:
        for row in doc["results"]:
            rows.pop(row["program"], None)  # (a later part's row, in that part's order)
            rows[row["program"]] = row
    out = dict(first)
    out["results"] = list(rows.values())
    out["summary"] = summary(out["results"])
    return out


def _sitting(doc: dict) -> dict:
    """What parts of one sitting share: its settings and the tree's commit."""
    return {**{key: doc.get(key) for key in SITTING_KEYS}, "commit": doc["environment"].get("commit")}


if __name__ == "__main__":
    sys.exit(main())
