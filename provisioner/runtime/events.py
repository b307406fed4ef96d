"""The resources' Events, posted in the background."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from provisioner.kube.client import Kube
from provisioner.reconciler.outcome import Event

log = logging.getLogger(__name__)

# Events waiting for their post at most; past that a new one is dropped (and counted in
# the log), as client-go's recorder drops Events when its queue of 1,000 is full.
EVENT_BACKLOG = 1000


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
        future = executor.submit(
            kube.post_event, body, event.type, event.reason, event.message, "provisioner"
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
