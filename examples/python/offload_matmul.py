"""wasmtime-py with one call changed: a WASI program whose loops offload.

    python examples/python/offload_matmul.py [n] [--device auto|gpu|cpu]

Runs examples/wasi/build/matmul.O2.wasm (an n x n f32 matrix product) through
``tensorwasm.instantiate`` with a wasmtime Linker that defines WASI, then prints the offload
report: where each of its loops ran and what it moved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import wasmtime

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensorwasm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("n", nargs="?", default="256")
    parser.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    args = parser.parse_args()
    wasm = (ROOT / "examples/wasi/build/matmul.O2.wasm").read_bytes()

    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["matmul", args.n]
    wasi.inherit_stdout()
    store.set_wasi(wasi)

    # The one changed call: linker.instantiate(store, wasmtime.Module(engine, wasm)).
    instance = tensorwasm.instantiate(store, wasm, linker=linker, device=args.device)
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as exc:
        if exc.code:
            return exc.code
    found = tensorwasm.report(instance)
    for loop in found.loops:
        if loop.arrivals:
            print(
                f"{loop.func} +0x{loop.offset:x}: ran {loop.offloaded} of {loop.arrivals} times on {loop.device}, "
                f"{loop.bytes_in + loop.bytes_out} bytes moved; declined: {loop.declined or 'never'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
