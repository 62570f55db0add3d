"""The differential oracle: generated programs on wasmtime against a backend (``fuzz``)."""

from pathlib import Path

# Where shrunk failures are saved, and replayed by the test suite.
REGRESSIONS = Path(__file__).resolve().parents[1] / "tests" / "regressions"
# The generator families (oracle.generators.GENERATORS), named here for the command line,
# which must not import Hypothesis to parse its arguments.
GENERATOR_NAMES = ("numeric", "control", "loops", "smith")
