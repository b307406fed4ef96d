"""Where a pass runs: its slot among the passes in flight, the resource's lock, and the
threads its blocking calls (boto3, the Kubernetes client) run on.

Change passes (create, update, resume, delete, recheck) and periodic looks have threads
and bounds of their own: a look waiting for the call budget, or a round of thousands of
them, never holds a thread or a slot that a create, a spec change or a deletion waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from provisioner.aws.turns import CALLER
from provisioner.reconciler.fair_slots import ContextThreadPool, FairSlots
from provisioner.reconciler.state import States

T = TypeVar("T")

# Set inside a periodic look (a resync pass and its batched describe): its blocking calls
# run on the looks' own threads.
LOOKING: contextvars.ContextVar[bool] = contextvars.ContextVar("looking", default=False)


class Workers:
    def __init__(self, workers: int, passes_per_namespace: int, states: States) -> None:
        self.workers = max(1, workers)
        self.states = states
        # Its calls run in the pass's context: the call budget sees whose they are (CALLER).
        self.executor = ContextThreadPool(max_workers=self.workers, thread_name_prefix="cloud")
        looks = max(1, self.workers // 2)
        self.look_executor = ContextThreadPool(max_workers=looks, thread_name_prefix="look")
        # Bounds the passes in flight at once. A burst of 1,000 new resources then finishes
        # in waves (each one quickly) instead of all together at the end, holding far less
        # memory. A freed slot goes to the namespaces that wait in turn, and one namespace
        # holds at most `passes_per_namespace` (fair_slots.py): a burst in one namespace
        # does not hold up another's resources.
        self.passes_in_flight = FairSlots(self.workers, passes_per_namespace)
        self.looks_in_flight = asyncio.Semaphore(looks)
        # Change passes running or waiting for a slot: while they fill every slot, the
        # periodic looks wait (`Reconciler.look_backlog`).
        self.changes_in_flight = 0

    async def in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call on the cloud thread pool; inside a periodic look (`LOOKING`),
        on the looks' own."""
        loop = asyncio.get_running_loop()
        executor = self.look_executor if LOOKING.get() else self.executor
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    async def write(self, uid: str, fn: Callable[..., T], *args: Any) -> T:
        """A call that changes the cloud (create, update, a password, delete). While it runs,
        and for any batched describe that started before it returned, the batch's answer
        may predate the write: `last_write` is "now and later" until it returns."""
        state = self.states.of(uid)
        state.last_write = math.inf
        try:
            return await self.in_thread(fn, *args)
        finally:
            state.last_write = time.monotonic()

    @contextlib.asynccontextmanager
    async def change_pass(self, uid: str, namespace: str = "") -> AsyncIterator[None]:
        """A slot of `passes_in_flight` in `namespace`'s turn ("": not known) and the
        resource's lock, counted as a change; its AWS calls wait their turn as that
        namespace's at the call budget."""
        self.changes_in_flight += 1
        caller = CALLER.set(namespace)
        try:
            async with self.passes_in_flight.slot(namespace), self.states.of(uid).lock:
                yield
        finally:
            CALLER.reset(caller)
            self.changes_in_flight -= 1

    @contextlib.asynccontextmanager
    async def look(self, uid: str) -> AsyncIterator[None]:
        """A periodic look's slot and the resource's lock."""
        async with self.looks_in_flight, self.states.of(uid).lock:
            yield

    @contextlib.asynccontextmanager
    async def resync_slot(self, uid: str) -> AsyncIterator[None]:
        """A slot of the change passes' bound and the resource's lock, uncounted."""
        async with self.passes_in_flight, self.states.of(uid).lock:
            yield

    @property
    def changes_busy(self) -> bool:
        """Whether change passes fill every slot (or wait for one)."""
        return self.changes_in_flight >= self.workers
