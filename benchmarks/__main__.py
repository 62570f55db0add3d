"""``python -m benchmarks``: the benchmark suite against its peers (see :mod:`benchmarks.runner`)."""

from __future__ import annotations

import sys

from benchmarks.runner import main

if __name__ == "__main__":
    sys.exit(main())
