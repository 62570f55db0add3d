"""Dependencies point one way: support <- dialect <- compiler <- runtime <- oracle.

Every product file (``tensorwasm/`` with its support package, ``dialect/``, ``compiler/``,
``runtime/``) is read with :mod:`ast`, and each module it imports is checked against its
layer's rule: the statements ``import`` and ``from ... import`` wherever they stand (in a
function, under ``TYPE_CHECKING``), and the imports in disguise, a module named by a
constant to ``LazyModule`` or ``importlib.import_module``. Imports are absolute, under the
one import name ``tensorwasm``.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

# The layers below the oracle, by the folder that holds them.
FOLDERS = {
    "tensorwasm/support": "support",
    "dialect": "dialect",
    "compiler": "compiler",
    "runtime": "runtime",
}
# What each layer may not import (of tensorwasm's packages), with why.
FORBIDDEN = {
    "support": ({"dialect", "compiler", "runtime", "oracle"}, "support imports no other tensorwasm package"),
    "dialect": ({"compiler", "runtime", "oracle"}, "dialect imports only support"),
    "compiler": ({"runtime", "oracle"}, "the compiler never imports the runtime or the oracle"),
    "runtime": ({"oracle"}, "the runtime never imports the oracle"),
    "tensorwasm": ({"oracle"}, "the product never imports the oracle"),  # the package's own files
}
# The names the subpackages had before they were one package: importing one finds another
# distribution's package (PyPI has runtime, compiler and dialect), or nothing.
OLD_NAMES = {"dialect", "compiler", "runtime", "oracle", "support"}


def product_files() -> list[tuple[str, str]]:
    """(path from the repository's root, layer) of every product source file."""
    found = [
        (path.relative_to(ROOT).as_posix(), "tensorwasm")
        for path in sorted((ROOT / "tensorwasm").glob("*.py"))
    ]
    for folder, layer in FOLDERS.items():
        found += [
            (path.relative_to(ROOT).as_posix(), layer) for path in sorted((ROOT / folder).rglob("*.py"))
        ]
    return found


def package_of(path: str) -> str:
    """The package a file (its path from the repository's root) is part of, by its import
    name: ``runtime/x.py`` -> ``tensorwasm.runtime``."""
    parts = path.split("/")[:-1]
    return ".".join(parts if parts[0] == "tensorwasm" else ["tensorwasm", *parts])


def imports(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of each module the source, a file of ``package``,
    imports; ``from tensorwasm import runtime`` imports ``tensorwasm.runtime``, and a
    relative import is resolved as Python resolves it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*above, *([base] if base else [])])
            if base == "tensorwasm" or not node.module:  # (names that may be modules)
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("LazyModule", "import_module") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def violations(path: str, layer: str, source: str) -> list[str]:
    """What in ``source`` (the file ``path`` of ``layer``) breaks the rules, one line each."""
    forbidden, rule = FORBIDDEN[layer]
    broken = []
    for line, module in imports(source, package_of(path)):
        top, _, rest = module.partition(".")
        part = rest.partition(".")[0]
        if top in OLD_NAMES:
            broken.append(f"{path}:{line}: imports {module}: the import name is tensorwasm.{module}")
        elif top == "tensorwasm" and part in forbidden:
            broken.append(f"{path}:{line}: imports {module}: {rule}")
    return broken


def test_every_layer_imports_only_what_is_below_it() -> None:
    files = product_files()
    assert {layer for _, layer in files} == set(FORBIDDEN)  # every layer was found and read
    broken = [line for path, layer in files for line in violations(path, layer, (ROOT / path).read_text())]
    assert not broken, "imports against the layering:\n" + "\n".join(broken)


# A file of each layer, for the checks of the rules themselves.
FILE = {
    "support": "tensorwasm/support/x.py",
    "dialect": "dialect/x.py",
    "compiler": "compiler/lower/x.py",
    "runtime": "runtime/x.py",
    "tensorwasm": "tensorwasm/x.py",
}


@pytest.mark.parametrize(
    ("layer", "source", "said"),
    [
        ("support", "from tensorwasm.runtime import driver", "support imports no other tensorwasm package"),
        (
            "support",
            "def f():\n    import tensorwasm.dialect.ir",
            "support imports no other tensorwasm package",
        ),
        ("support", "from .. import runtime", "support imports no other tensorwasm package"),
        ("dialect", "from tensorwasm.compiler.target import host", "dialect imports only support"),
        ("dialect", "from ..compiler import target", "dialect imports only support"),
        (
            "compiler",
            "from tensorwasm import runtime",
            "the compiler never imports the runtime or the oracle",
        ),
        (
            "compiler",
            "if TYPE_CHECKING:\n    from tensorwasm.oracle import case",
            "the compiler never imports",
        ),
        ("compiler", "from ...runtime.driver import Context", "the compiler never imports the runtime"),
        ("runtime", "from tensorwasm.oracle.cli import add_parser", "the runtime never imports the oracle"),
        ("runtime", 'x = LazyModule("tensorwasm.oracle.fuzz", globals(), "x")', "the runtime never imports"),
        (
            "runtime",
            'importlib.import_module("tensorwasm.oracle.cli")',
            "the runtime never imports the oracle",
        ),
        ("tensorwasm", "import tensorwasm.oracle", "the product never imports the oracle"),
        ("tensorwasm", "from . import oracle", "the product never imports the oracle"),
        ("runtime", "import runtime.driver", "the import name is tensorwasm.runtime.driver"),
    ],
)
def test_a_broken_rule_is_found_and_named(layer: str, source: str, said: str) -> None:
    (line,) = violations(FILE[layer], layer, source)
    assert line.startswith(f"{FILE[layer]}:") and said in line


@pytest.mark.parametrize(
    ("layer", "source"),
    [
        ("support", "import os\nfrom tensorwasm.support.errors import TensorWasmError\nfrom . import logs"),
        ("dialect", "from tensorwasm.support import records\nfrom tensorwasm.dialect.types import I32"),
        ("compiler", "from tensorwasm.dialect import ir\nfrom ..target import host\nfrom . import env"),
        ("runtime", "from tensorwasm.compiler.rewrite import HOST_MODULE\nfrom .driver import Context"),
        ("tensorwasm", "from tensorwasm.runtime import api"),
    ],
)
def test_imports_downwards_are_allowed(layer: str, source: str) -> None:
    assert violations(FILE[layer], layer, source) == []


# The most lines a class of the product may take: past this a class does several things.
CLASS_LINES = 400


def test_no_class_of_the_product_is_over_400_lines() -> None:
    large = []
    for path, _ in product_files():
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                large.append(f"{path}: {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not large, f"classes over {CLASS_LINES} lines:\n" + "\n".join(large)
