"""``python -m benchmarks.peers FAMILY --sizes small|large [--programs a,b] --out FILE``:
run one peer family (see :data:`benchmarks.peers.FAMILIES`) and write its JSON document."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from benchmarks.peers import FAMILIES
from benchmarks.programs import SIZE_SETS, select


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--sizes", choices=SIZE_SETS, default="small")
    parser.add_argument("--programs", default="all", help="comma-separated program names")
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON document")
    args = parser.parse_args(argv)
    try:
        programs = select(args.programs)
    except ValueError as exc:
        print(f"benchmarks.peers: {exc}", file=sys.stderr)
        return 2
    module_name, attr = FAMILIES[args.family].split(":")
    module = importlib.import_module(module_name)
    if args.family == "copy":
        document = module.measure(args.sizes)
    else:
        from benchmarks.peers.harness import run_peer

        document = run_peer(getattr(module, attr), args.family, programs, args.sizes)
    args.out.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
