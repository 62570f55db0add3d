"""``python -m benchmarks``: the benchmark suite against its peers (see :mod:`benchmarks.runner`).

The other measurements are modules of their own: ``python -m benchmarks.polybench``
(PolyBench/C 4.2.1 against plain wasmtime), ``python -m benchmarks.declines`` (what a
declined loop costs per arrival), ``benchmarks.offload``, ``benchmarks.start``, ...
"""

from __future__ import annotations

import sys

from benchmarks.runner import main

if __name__ == "__main__":
    sys.exit(main())
