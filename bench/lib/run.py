"""The benchmark against a running stack: the phases in order, then the final figures."""

from __future__ import annotations

from bench.lib import create, log, phases
from bench.lib.session import Bench


def run(b: Bench) -> None:
    """Create until all Ready; then, if they all were, idle, restart and changes; delete."""
    start = b.recording.mark()
    try:
        ok = create.phase(b)
        if ok and not b.errors:
            b.enter("idle")
            phases.idle(b)
            if b.o.restart > 0:
                b.enter("restart")
                phases.restart(b)
            if b.o.changes > 0:
                b.enter("changes")
                phases.changes(b)
        else:
            log("not every CR became Ready: skipping the idle, restart and change phases")
        b.enter("delete")
        phases.delete(b)
        b.finish()
        if b.account_ids:
            calls = b.recording.calls(start, b.recording.mark())["by_action"]
            b.results["assume_role_calls"] = calls.get("sts:AssumeRole", 0)
    finally:
        b.lister.stop()
        if b.synced is not None:
            b.synced.stop()
            b.results["synced_false"] = b.synced.summary()
