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
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from provisioner.aws.turns import CALLER
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ExternalClient
from provisioner.reconciler.fair_slots import ContextThreadPool, FairSlots
from provisioner.reconciler.state import States

T = TypeVar("T")

# Set inside a periodic look (a resync pass and its batched describe): its blocking calls
# run on the looks' own threads.
LOOKING: contextvars.ContextVar[bool] = contextvars.ContextVar("looking", default=False)


class Workers:
    def __init__(
        self, settings: Settings, clients: Mapping[str, ExternalClient], states: States
    ) -> None:
        self.settings = settings
        self.clients = clients
        self.workers = max(1, settings.workers)
        self.states = states
        passes_per_namespace = settings.passes_per_namespace
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

    def look_backlog(self, kind: str, region: str, account: Any = None) -> float:
        """Seconds a periodic look of `kind` (in that account and region) should wait rather
        than start now; 0: start it. The resync defers it by that much instead of queueing
        it (creates and changes go first):

        - while change passes fill every slot: to a random time in the next period. A look
          costs about what a create costs; with thousands of resources the looks coming due
          during a long burst of creates would otherwise take a share of the API server and
          the cloud that grows with the number of resources. Spread over the next period,
          those put off during a burst do not all come back together when it ends;
        - the seconds the calls already waiting on the call budget of `kind`'s service
          still wait, when any does."""
        if self.changes_busy:
            return self.settings.resync_seconds * random.uniform(0.1, 1.0)
        budget = getattr(getattr(self.clients.get(kind), "aws", None), "budget", None)
        if budget is None:
            return 0.0
        service = kinds.descriptor(kind).service
        return float(budget.backlog(service, region, account.account_id if account else ""))
