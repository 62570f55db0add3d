"""Bad input through every command: mutated and malformed modules must never crash it.

Each case is a module made from a seed (the project's own examples and ``wasm-tools
smith`` output): a valid module changed by ``wasm-tools mutate`` (it may trap at
instantiation, loop, or ask for huge tables and memories), or bytes flipped, cut or
inserted (malformed). Every command (``inspect``, ``compile``, ``invoke``, ``run``) runs
it in a fresh process, with a time limit, and a case fails where:

- the process printed a Python traceback or died of a signal;
- it ran past the time limit where plain wasmtime, given the same module, finished;
- its peak memory passed the limit (``--max-rss-mib``);
- ``run`` refused, for a proposal TensorWasm does not compile, a module that wasmtime
  validates (such a module runs, its untranslatable functions on wasmtime).

``python -m tensorwasm.oracle.badinput --seconds 60 --seed 7`` prints each failure (the
command, what went wrong and the module's saved path) and a count per command.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (
    "examples/loops/build/blas1.O2.wasm",
    "examples/loops/build/stencil.O2.wasm",
    "examples/loops/build/reductions.O1.wasm",
    "examples/wasi/build/histogram.O2.wasm",
    "examples/wasi/build/reduce.O2.wasm",
)
COMMANDS = ("inspect", "compile", "invoke", "run")
# Exit statuses a command may end with on bad input: success, its one-line error, a Wasm
# trap (``run``), and whatever a WASI program returns (``run``: any status it chooses).
# ``invoke`` ends with 1 where a call answered an error (one JSON line says which).
CLEAN = {"inspect": {0, 2}, "compile": {0, 2}, "invoke": {0, 1, 2}}


@dataclass
class Outcome:
    cases: int = 0
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COMMANDS, 0))
    failures: list[str] = field(default_factory=list)


def _wasm_tools() -> str | None:
    return shutil.which("wasm-tools")


def _smith(rng: random.Random, tools: str) -> bytes | None:
    done = subprocess.run(
        [tools, "smith", "--ensure-termination", "--min-funcs", "1"],
        input=rng.randbytes(256),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.stdout if done.returncode == 0 else None


def _mutate(data: bytes, rng: random.Random, tools: str, work: Path) -> bytes | None:
    source = work / "seed.wasm"
    source.write_bytes(data)
    done = subprocess.run(
        [tools, "mutate", str(source), "--seed", str(rng.randrange(2**32)), "-o", str(work / "mutated.wasm")],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return (work / "mutated.wasm").read_bytes() if done.returncode == 0 else None


def _malform(data: bytes, rng: random.Random) -> bytes:
    """Flip, cut or insert bytes past the header (the decoder's errors, not a bad magic)."""
    raw = bytearray(data)
    kind = rng.randrange(3)
    at = rng.randrange(8, max(9, len(raw)))
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(8, len(raw))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del raw[at:]
    else:
        raw[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(raw)


def _argv(command: str, module: Path, work: Path) -> list[str]:
    base = [sys.executable, "-m", "tensorwasm", command, str(module)]
    if command == "inspect":
        return [*base, "--stage", "loops"]
    if command == "compile":
        return [*base, "-o", str(work / "out"), "--target", "sm_90"]
    if command == "invoke":
        return [*base, "--backend", "cpu", "--calls", str(work / "calls.jsonl")]
    return [*base, "--device", "cpu"]


def _calls(data: bytes) -> str:
    """One call of every exported function that takes no arguments (the rest need values)."""
    from tensorwasm.compiler.frontend import load
    from tensorwasm.support.errors import TensorWasmError

    try:
        wasm = load(data)
    except TensorWasmError:
        return ""
    lines = []
    for export in wasm.exports:
        if export.kind == "func" and not wasm.func_sig(export.index).params:
            lines.append(f'{{"func": "{export.name}", "args": []}}')
    return "\n".join(lines) + "\n"


def _run(argv: list[str], seconds: float, env: dict[str, str]) -> tuple[int | None, str, int]:
    """Exit status (None: timed out), stderr, and the child's peak memory in KiB."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=seconds, env=env,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        status, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        status, err = (
            None,
            (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else "",
        )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return status, err, peak if peak > before else 0


def _wasmtime_finishes(module: Path, seconds: float) -> bool:
    code = (
        "import sys, wasmtime\n"
        "engine = wasmtime.Engine()\n"
        "module = wasmtime.Module(engine, open(sys.argv[1], 'rb').read())\n"
        "linker = wasmtime.Linker(engine)\n"
        "linker.define_wasi()\n"
        "store = wasmtime.Store(engine)\n"
        "store.set_wasi(wasmtime.WasiConfig())\n"
        "try:\n"
        "    instance = linker.instantiate(store, module)\n"
        "    start = instance.exports(store).get('_start')\n"
        "    if start is not None:\n"
        "        start(store)\n"
        "except Exception:\n"
        "    pass\n"
    )
    try:
        subprocess.run(
            [sys.executable, "-c", code, str(module)], capture_output=True, timeout=seconds, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return True


def _unsupported(err: str) -> bool:
    """Whether a command's one-line error is the compiler's refusal of a proposal."""
    return "does not support" in err or "is not supported" in err


def _wasmtime_validates(module: Path) -> bool:
    import wasmtime

    try:
        wasmtime.Module.validate(wasmtime.Engine(), module.read_bytes())
    except wasmtime.WasmtimeError:
        return False
    return True


def check(
    module: Path, command: str, work: Path, seconds: float, max_rss_kib: int, env: dict[str, str]
) -> str | None:
    """What went wrong when ``command`` ran ``module``, or None."""
    status, err, peak = _run(_argv(command, module, work), seconds, env)
    if "Traceback (most recent call last)" in err:
        return "a traceback: " + err.strip().splitlines()[-1][:300]
    if status is None:
        if command in ("run", "invoke") and not _wasmtime_finishes(module, seconds):
            return None  # the program itself does not end (wasmtime's neither)
        return f"no answer in {seconds:.0f} s"
    if status < 0:
        return f"died of signal {-status}"
    if command in CLEAN and status not in CLEAN[command]:
        return f"exit status {status}: {err.strip()[-300:]}"
    if command == "run" and status == 2 and _unsupported(err) and _wasmtime_validates(module):
        return f"refused a module wasmtime runs: {err.strip()[-300:]}"
    if peak > max_rss_kib:
        return f"peak memory {peak >> 10} MiB (limit {max_rss_kib >> 10} MiB)"
    return None


def fuzz(seconds: float, seed: int, save: Path, timeout: float = 60.0, max_rss_mib: int = 2048) -> Outcome:
    """Bad-input cases until ``seconds`` have passed; failures' modules saved under ``save``."""
    tools = _wasm_tools()
    rng = random.Random(seed)
    outcome = Outcome()
    seeds = [(ROOT / s).read_bytes() for s in SEEDS if (ROOT / s).exists()]
    env = {
        **os.environ,
        "TENSORWASM_CACHE": "off",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    end = time.monotonic() + seconds
    save.mkdir(parents=True, exist_ok=True)
    while time.monotonic() < end:
        with tempfile.TemporaryDirectory(prefix="tw-badinput-") as tmp:
            work = Path(tmp)
            data = rng.choice(seeds)
            if tools is not None and rng.random() < 0.3:
                data = _smith(rng, tools) or data
            made = _mutate(data, rng, tools, work) if tools is not None and rng.random() < 0.6 else None
            data = made if made is not None else _malform(data, rng)
            module = work / "case.wasm"
            module.write_bytes(data)
            (work / "calls.jsonl").write_text(_calls(data))
            outcome.cases += 1
            for command in COMMANDS:
                outcome.runs[command] += 1
                why = check(module, command, work, timeout, max_rss_mib << 10, env)
                if why is not None:
                    kept = save / f"case-{seed}-{outcome.cases}.wasm"
                    kept.write_bytes(data)
                    outcome.failures.append(f"{command} {kept}: {why}")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one command may take")
    parser.add_argument("--max-rss-mib", type=int, default=2048)
    parser.add_argument("--save-dir", type=Path, default=Path(tempfile.gettempdir()) / "tensorwasm-badinput")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    outcome = fuzz(args.seconds, seed, args.save_dir, args.timeout, args.max_rss_mib)
    for line in outcome.failures:
        print(line)
    runs = ", ".join(f"{c} {n}" for c, n in outcome.runs.items())
    print(f"bad input (seed {seed}): {outcome.cases} modules, runs: {runs}; {len(outcome.failures)} failed")
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
