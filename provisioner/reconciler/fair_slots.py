"""Pass slots shared fairly between namespaces, and threads that keep the caller's context.

`FairSlots` bounds the passes in flight at once, like a semaphore, but hands a freed slot to
the namespaces that wait in turn (round-robin), each namespace's own waiters first come,
first served; and a namespace holds at most `cap` slots at once (0: no cap). One namespace
creating a thousand resources then has as many passes in flight as its cap allows and no
more, and another namespace's single resource gets the next free slot, not the thousand-
and-first. The namespace "" (a pass whose namespace is not known) takes its turns like any
other and is not capped.

`fair_workers` does the same for kopf's per-object workers of the operator's own kinds: kopf
runs them first come, first served up to one limit per watch (one watch per kind serves every
namespace), so a bound there would queue another namespace's new resource behind a burst;
unbounded, a burst of 10,000 would hold 10,000 workers' bodies, diffs and patches at once.
Gated here, each kind's workers start each namespace in turn, and one namespace holds at
most half of them.

`fair_requests` puts kopf's requests to the API server (finalizers, status patches) through
such slots too, by the namespace in their path: a thousand new resources in one namespace
queue a thousand finalizer patches, and another namespace's patch takes the next slot, not
the thousand-and-first. Watch streams, held open for good, take none.

`ContextThreadPool` runs each submitted call in a copy of the submitter's context variables,
so that what a pass set (the namespace its AWS calls are made for: `budget.CALLER`) reaches
the blocking calls it runs on the pool's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
from aiohttp.client_middlewares import ClientHandlerType, ClientMiddlewareType

T = TypeVar("T")


class FairSlots:
    def __init__(self, slots: int, cap: int = 0) -> None:
        self.slots = max(1, slots)
        # Slots one namespace may hold at once (0: no cap; never capped: "").
        self.cap = max(0, cap)
        self.free = self.slots
        self.held: Counter[str] = Counter()
        # Each namespace's waiters, first come first; and the namespaces that wait, in the
        # order of their next turn.
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self._turns: deque[str] = deque()

    @property
    def waiting(self) -> int:
        """Acquirers waiting for a slot."""
        return sum(len(q) for q in self._waiters.values())

    def _under_cap(self, namespace: str) -> bool:
        return not self.cap or not namespace or self.held[namespace] < self.cap

    async def acquire(self, namespace: str) -> None:
        """Take a slot for `namespace`, waiting for the namespace's turn when none is free or
        the namespace holds its cap."""
        if self.free > 0 and not self._waiters.get(namespace) and self._under_cap(namespace):
            self._take(namespace)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters.get(namespace)
        if queue is None:
            queue = self._waiters[namespace] = deque()
            self._turns.append(namespace)
        queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(namespace)  # given a slot, then cancelled before it ran
            else:
                self._forget(namespace, future)
            raise

    def release(self, namespace: str) -> None:
        """Give back a slot that `namespace` holds; the next namespace in turn gets it."""
        if self.held[namespace] <= 0:
            raise RuntimeError(f"namespace {namespace!r} holds no slot")
        self.held[namespace] -= 1
        if not self.held[namespace]:
            del self.held[namespace]
        self.free += 1
        self._dispatch()

    @contextlib.asynccontextmanager
    async def slot(self, namespace: str) -> AsyncIterator[None]:
        await self.acquire(namespace)
        try:
            yield
        finally:
            self.release(namespace)

    async def __aenter__(self) -> None:
        await self.acquire("")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release("")

    def _take(self, namespace: str) -> None:
        self.free -= 1
        self.held[namespace] += 1

    def _forget(self, namespace: str, future: asyncio.Future[None]) -> None:
        queue = self._waiters.get(namespace)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self._waiters[namespace]
                self._turns.remove(namespace)

    def _dispatch(self) -> None:
        """Hand the free slots to the namespaces that wait and may take one, in turn."""
        passed = 0  # namespaces in a row that could not take one (at their cap)
        while self.free > 0 and self._turns and passed < len(self._turns):
            namespace = self._turns.popleft()
            queue = self._waiters[namespace]
            while queue and queue[0].done():  # cancelled, not yet forgotten by its task
                queue.popleft()
            if queue and not self._under_cap(namespace):
                self._turns.append(namespace)
                passed += 1
                continue
            if queue:
                passed = 0
                self._take(namespace)
                queue.popleft().set_result(None)
            if queue:
                self._turns.append(namespace)
            else:
                del self._waiters[namespace]


def namespace_of(path: str) -> str:
    """The namespace an API path is in ("": cluster-scoped)."""
    parts = path.split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "namespaces":
            return parts[i + 1]
    return ""


def fair_requests(slots: FairSlots) -> ClientMiddlewareType:
    """An aiohttp client middleware: each request but a watch in a slot of its namespace's,
    from before it takes a connection until its answer's headers are in."""

    async def middleware(
        request: aiohttp.ClientRequest, handler: ClientHandlerType
    ) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with slots.slot(namespace_of(request.url.path)):
            return await handler(request)

    return middleware


def _stream_namespace(stream: Any) -> str:
    """The namespace of the object whose events `stream` (kopf's per-object queue) holds."""
    waiting = getattr(getattr(stream, "backlog", None), "_queue", None) or ()
    for raw_event in waiting:
        if isinstance(raw_event, dict):
            meta = (raw_event.get("object") or {}).get("metadata") or {}
            return str(meta.get("namespace") or "")
    return ""


def fair_workers(limit: int, cap: int, group: str) -> None:
    """Start kopf's workers of `group`'s resources in slots of their namespaces', `limit` of
    each kind at once, at most `cap` of one namespace (kopf's own limit is then to be off:
    `settings.queueing.worker_limit = None`). RuntimeError where the pinned kopf's worker is
    not there to wrap."""
    from kopf._core.reactor import queueing

    current = getattr(queueing, "worker", None)
    if current is None:
        raise RuntimeError("kopf has no queueing.worker: its workers cannot take turns")
    original = getattr(current, "ungated", current)
    kinds: dict[Any, FairSlots] = {}  # kopf's resource -> its workers' slots

    @functools.wraps(original)
    async def gated(**kwargs: Any) -> None:
        key, streams = kwargs["key"], kwargs["streams"]
        if getattr(key[0], "group", None) != group:
            await original(**kwargs)
            return
        namespace = _stream_namespace(streams.get(key))
        slots = kinds.get(key[0])
        if slots is None:
            slots = kinds[key[0]] = FairSlots(limit, cap)
        try:
            await slots.acquire(namespace)
        except asyncio.CancelledError:
            streams.pop(key, None)  # as the worker itself does when it ends
            raise
        try:
            await original(**kwargs)
        finally:
            slots.release(namespace)

    gated.ungated = original  # type: ignore[attr-defined]
    queueing.worker = gated


class ContextThreadPool(ThreadPoolExecutor):
    """A thread pool whose calls run in a copy of the submitter's context variables."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        context = contextvars.copy_context()
        return super().submit(context.run, fn, *args, **kwargs)
