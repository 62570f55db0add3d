"""``python -m tensorwasm ...``: the ``tensorwasm`` command."""

from tensorwasm.runtime.cli import entry

entry()
