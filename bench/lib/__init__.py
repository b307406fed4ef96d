"""The parts of bench/converge.py, and what bench/ack.py, bench/soak.py and bench/fairness.py
share with it.

listwatch      one LIST-then-WATCH loop per collection, a thread each (every watch of the benches)
workload       the kinds, their specs and spec changes, the CRs and the watch that follows them
measure        figures: percentiles, /proc, the API server's write counters, the source hash
recording      AWS calls from moto's request recording
synced, bound  aws-like: every Synced=False seen by WATCH; the bound the cloud's limits set
options        bench/converge.py's options
profile        py-spy attached to the operator, and its samples summarised
session        Bench: the CRs and their watches, sampling, prepare, finish
create         the create phase: N CRs from nothing to Ready
phases         idle, restart, spec changes, delete
run            the benchmark: the phases in order
report         the summary, the table (declared row by row) and the profile text
ack_*          bench/ack.py's: ACK's controller, one controller's run, its counts, its table
soak_*         bench/soak.py's: the operators and their killer, the table

Each module imports only from the ones listed above it (pyproject.toml, import-linter).
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
