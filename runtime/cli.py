"""The ``tensorwasm`` command line.

Every subcommand turns the project's own errors into one line on stderr and exit status
2; anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from dialect.errors import TensorWasmError

log = logging.getLogger("tensorwasm")


def _select_functions(module, key: str | None) -> set[int] | None:
    """Function indices named by ``--func`` (an index, an export or a debug name)."""
    if key is None:
        return None
    if key.isdigit():
        index = int(key)
        if index >= module.num_funcs:
            raise TensorWasmError(f"no function {index}: the module has {module.num_funcs}")
        return {index}
    for exp in module.exports:
        if exp.kind == "func" and exp.name == key:
            return {exp.index}
    for index, name in module.func_names.items():
        if name == key:
            return {index}
    raise TensorWasmError(f"no function named {key!r} (by export or debug name)")


def cmd_inspect(args: argparse.Namespace) -> int:
    from compiler.frontend import load, read_wasm, translate_function
    from compiler.frontend.printer import print_module
    from dialect.printer import print_function

    module = load(read_wasm(args.module))
    only = _select_functions(module, args.func)
    if args.stage == "wasm":
        sys.stdout.write(print_module(module, only))
        return 0
    indices = sorted(only) if only is not None else range(module.num_imported_funcs, module.num_funcs)
    for index in indices:
        if index < module.num_imported_funcs:
            imp = module.imported("func")[index]
            print(f"func @{module.func_name(index)} import {imp.module!r}.{imp.name!r}")
            continue
        func = translate_function(module, index)
        if args.stage == "dialect":
            sys.stdout.write(print_function(func))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorwasm", description="Compile WebAssembly to NVIDIA PTX and run it on the GPU."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    inspect = sub.add_parser("inspect", help="print a stage of the pipeline for a module")
    inspect.add_argument("module", help="a .wasm or .wat file")
    inspect.add_argument("--stage", choices=["wasm", "dialect"], default="dialect")
    inspect.add_argument("--func", help="only this function (index, export or debug name)")
    inspect.set_defaults(run=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="tensorwasm: %(message)s"
    )
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except TensorWasmError as exc:
        print(f"tensorwasm: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
