"""The parts of bench/converge.py.

workload  the kinds, their specs and spec changes, the CRs and the watch that follows them
measure   figures: percentiles, /proc, the API server's write counters, the source hash
recording AWS calls from moto's request recording
run       the benchmark: options, sampling, prepare, the phases in order, finish
create    the create phase: N CRs from nothing to Ready
phases    idle, spec changes, delete
profile   py-spy attached to the operator, and its samples summarised
report    the summary, the table (declared row by row) and the profile text
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Failure(Exception):
    """The benchmark cannot go on (reported, and the stack stopped)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


def stop_on_signals() -> None:
    """SIGTERM raises Interrupted; Ctrl-C works even where SIGINT was ignored at start (a
    background job of a script): both stop the bench the way Ctrl-C does."""

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
