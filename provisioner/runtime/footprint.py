"""What keeps the operator's memory small where kopf and asyncio offer no setting for it.

**Watch events without `metadata.managedFields`.** kopf keeps every watch event of an object
whose worker has not reached it yet, whole body included, and a burst (a thousand new
resources, a restart, a namespace deleted) holds thousands of them at once. managedFields are
most of a parsed body (about 10 of 15 KB for a Ready S3Bucket) and nothing in kopf or in this
operator reads them, so they are dropped as each event arrives, before kopf queues it (the API
server cannot be asked to leave them out of a LIST or a WATCH). kopf has no public hook for
raw events: this wraps the one generator every watcher reads,
`kopf._cogs.clients.watching.infinite_watch`, of the pinned kopf; `install()` fails at start,
in one line, where that generator is not there, rather than run without it unseen.

**Smaller TLS read buffers.** asyncio gives each TLS connection (kopf's, to the API server) a
read buffer of 256 KiB, allocated and zeroed whole when the connection opens, whatever it
carries. A TLS record holds at most 16 KiB, so reads of 64 KiB lose nothing but a few loop
turns on a large LIST, and each connection costs 64 KiB instead.
"""

from __future__ import annotations

import functools
from asyncio import sslproto
from collections.abc import AsyncIterator, Callable
from typing import Any

LEFT_OUT = "managedFields"
TLS_READ_BUFFER = 64 * 1024


def lean(raw_event: Any) -> Any:
    """The event with its object's managedFields removed (in place: kopf owns no other copy)."""
    if isinstance(raw_event, dict):
        body = raw_event.get("object")
        if isinstance(body, dict):
            metadata = body.get("metadata")
            if isinstance(metadata, dict):
                metadata.pop(LEFT_OUT, None)
    return raw_event


def _wrap(watch: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(watch)
    async def lean_watch(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for raw_event in watch(*args, **kwargs):
            yield lean(raw_event)

    lean_watch.lean = True  # type: ignore[attr-defined]
    return lean_watch


def install() -> None:
    """Lean watch events for every kopf watcher, and small TLS read buffers for every
    asyncio TLS connection, of this process (idempotent)."""
    from kopf._cogs.clients import watching

    current = getattr(watching, "infinite_watch", None)
    if current is None:
        raise RuntimeError("kopf has no watching.infinite_watch: managedFields cannot be left out")
    if not getattr(current, "lean", False):
        watching.infinite_watch = _wrap(current)
    sslproto.SSLProtocol.max_size = min(sslproto.SSLProtocol.max_size, TLS_READ_BUFFER)
