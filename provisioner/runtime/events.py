"""The resources' Events, posted in the background."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from provisioner import tracing
from provisioner.kube.client import Kube
from provisioner.model.annotations import TRACE_ID
from provisioner.reconciler.outcome import Event

log = logging.getLogger(__name__)

# Events waiting for their post at most; past that a new one is dropped (and counted in
# the log), as client-go's recorder drops Events when its queue of 1,000 is full.
EVENT_BACKLOG = 1000
# An Event's message at most (the API server's limit), its trace id included.
MESSAGE_LIMIT = 1024


def traced(message: str, trace: str) -> str:
    """The message with its pass's trace id at the end, where `kubectl describe` and
    `kubectl get events` show it (the annotation carries it too, for programs)."""
    suffix = f" trace={trace}"
    return message[: MESSAGE_LIMIT - len(suffix)] + suffix


def event_poster(
    kube: Kube, executor: Executor, backlog: int = EVENT_BACKLOG
) -> Callable[[dict[str, Any], Event], None]:
    """Events are posted in the background: a pass never waits for them, and a failure to
    post one is logged, never fatal. A burst of thousands of creates against a slow API
    server queues at most `backlog` of them: memory stays bounded, and Events are not
    still being posted minutes after the burst."""
    lock = threading.Lock()
    waiting = dropped = 0

    def post(body: dict[str, Any], event: Event) -> None:
        nonlocal waiting, dropped
        with lock:
            if waiting >= backlog:
                dropped += 1
                if dropped % 100 == 1:
                    log.warning("%d Events dropped: %d wait for the API server", dropped, waiting)
                return
            waiting += 1
        message, annotations = event.message, None
        trace = tracing.trace_id()
        if trace:
            message, annotations = traced(message, trace), {TRACE_ID: trace}
        future = executor.submit(
            tracing.in_current_context(kube.post_event),
            body,
            event.type,
            event.reason,
            message,
            "provisioner",
            annotations,
        )
        future.add_done_callback(posted)

    def posted(future: Future[None]) -> None:
        nonlocal waiting
        with lock:
            waiting -= 1
        _log_failure(future)

    return post


def _log_failure(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("could not post an Event: %s", exc)
