"""Named points where a test can have the operator killed (SIGKILL), to prove crash safety.

Off unless PROVISIONER_CRASHPOINTS names the point (comma-separated). Each point fires
once per process: the restarted operator must then finish what the dead one started.
"""

from __future__ import annotations

import os
import signal

_fired: set[str] = set()


def crashpoint(name: str) -> None:
    wanted = os.environ.get("PROVISIONER_CRASHPOINTS", "")
    if not wanted or name in _fired:
        return
    if name in {w.strip() for w in wanted.split(",")}:
        _fired.add(name)
        os.kill(os.getpid(), signal.SIGKILL)
