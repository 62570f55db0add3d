"""The loggers of :mod:`dialect.logs`: a message below the configured level neither
imports :mod:`logging` nor is written; one at it is written as ``logging.basicConfig``
would write it; with :mod:`logging` imported (an application's, the tests' capture) the
real logger decides. Each check runs a fresh process, where nothing imported logging."""

from __future__ import annotations

import logging
import subprocess
import sys

from tensorwasm.support import logs
from tests.conftest import ROOT

_SCRIPT = """
import sys
from tensorwasm.support import logs

log = logs.get_logger("tensorwasm.runtime.cache")
logs.configure(logs.INFO if sys.argv[1] == "verbose" else logs.WARNING, format="tensorwasm: %(message)s")
log.info("preparing %s", "again")
print("after info:", "logging" in sys.modules, flush=True)
log.warning("cannot write %d entries", 3)
print("after warning:", "logging" in sys.modules, flush=True)
"""


def _run(level: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, level], capture_output=True, text=True, cwd=ROOT, check=True
    )


def test_below_the_level_nothing_is_imported_nor_written() -> None:
    done = _run("quiet")
    assert done.stdout == "after info: False\nafter warning: True\n"
    assert done.stderr == "tensorwasm: cannot write 3 entries\n"


def test_at_the_level_messages_are_written_as_basic_config_formats_them() -> None:
    done = _run("verbose")
    assert done.stdout == "after info: True\nafter warning: True\n"
    assert done.stderr == "tensorwasm: preparing again\ntensorwasm: cannot write 3 entries\n"


def test_with_logging_imported_the_real_logger_gets_every_message(caplog) -> None:
    log = logs.get_logger("tensorwasm.runtime.somewhere")
    with caplog.at_level(logging.DEBUG, logger="tensorwasm.runtime.somewhere"):
        log.debug("seen %d", 1)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("tensorwasm.runtime.somewhere", 10, "seen 1")
    ]
    assert caplog.records[0].funcName == "test_with_logging_imported_the_real_logger_gets_every_message"
