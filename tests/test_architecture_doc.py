"""docs/architecture.md stays true to the code: every product module is named in it."""

from __future__ import annotations

import re

from tests.conftest import ROOT

FOLDERS = ("tensorwasm", "dialect", "compiler", "runtime", "oracle")


def test_every_product_module_is_named_in_the_architecture_page() -> None:
    page = (ROOT / "docs/architecture.md").read_text()
    named = set(re.findall(r"`([A-Za-z_./]+)`", page))
    missing = [
        path.relative_to(ROOT).as_posix()
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.stem not in ("__init__", "__main__") and path.stem not in named
    ]
    assert not missing, "modules docs/architecture.md does not name: " + ", ".join(missing)
