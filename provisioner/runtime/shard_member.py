"""A replica's membership of a shard ring: its Lease, renewed every `renew_seconds`, and the
watchdog that stops the replica once the Lease has gone unrenewed for `deadline` seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from provisioner.runtime.shard_ring import RING_LABEL, RingLeases

log = logging.getLogger(__name__)


class Membership:
    """This replica's Lease in the ring. Renewals run on `renewer` (a thread of their own:
    they never wait behind anything); the members are counted on `executor`."""

    def __init__(
        self,
        leases: RingLeases,
        renewer: Executor,
        executor: Executor,
        fence: Callable[[str], None],
        on_members: Callable[[int], None] | None = None,
    ) -> None:
        self.leases = leases
        self.renewer = renewer
        self.executor = executor
        self.fence = fence
        # Told how many replicas hold a Lease in the ring (at start, then about every 10 s):
        # the AWS call budget is shared between them.
        self.on_members = on_members
        self.renewed_at: float | None = None  # monotonic time the last good renewal was sent

    @property
    def lease_name(self) -> str:
        return self.leases.lease_name

    def renew_membership(self) -> None:
        """Create or renew this replica's Lease (a blocking call)."""
        name = self.lease_name
        existing = self.leases.get(name)
        body = self.leases.body(name, existing)
        body["metadata"]["labels"][RING_LABEL] = self.leases.ring
        self.leases.write(name, existing, body)

    def count_members(self) -> int:
        """Replicas holding a Lease in the ring, dead ones not yet removed included (so a
        share computed from it errs on the small side); tells `on_members`."""
        count = sum(1 for i in self.leases.members() if (i.get("spec") or {}).get("holderIdentity"))
        count = max(1, count)
        if self.on_members is not None:
            self.on_members(count)
        return count

    async def renew(self) -> None:
        """Renew this replica's Lease; on success, it counts from when the request was sent."""
        sent = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(self.renewer, self.renew_membership)
        self.renewed_at = sent

    async def renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        rounds = 0
        while True:
            try:
                await self.renew()
            except Exception as exc:  # noqa: BLE001 - tried again; the watchdog decides
                log.warning("renewing the shard Lease %s failed: %s", self.lease_name, exc)
            rounds += 1
            if rounds % 5 == 0:
                try:
                    await loop.run_in_executor(self.executor, self.count_members)
                except Exception as exc:  # noqa: BLE001 - counted again later
                    log.debug("counting the shard members failed: %s", exc)
            await asyncio.sleep(self.leases.renew_seconds)

    async def watchdog(self) -> None:
        """Stop acting (exit) once the Lease has not been renewed for `deadline` seconds."""
        started = time.monotonic()
        deadline = self.leases.deadline
        while True:
            await asyncio.sleep(0.5)
            last = self.renewed_at if self.renewed_at is not None else started
            if time.monotonic() - last > deadline:
                self.fence(
                    f"the shard Lease {self.leases.namespace}/{self.lease_name} was not renewed "
                    f"for {deadline:.0f}s: stopping before another replica takes its resources"
                )
                return

    async def wait_member(self) -> None:
        """Return once this replica's Lease is held (before its watches start)."""
        loop = asyncio.get_running_loop()
        delay = 0.5
        while True:
            try:
                await self.renew()
                await loop.run_in_executor(self.executor, self.count_members)
                return
            except Exception as exc:  # noqa: BLE001 - the API server is not answering yet
                log.warning("creating the shard Lease %s failed: %s", self.lease_name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def leave(self) -> None:
        """Delete this replica's Lease, so that the sharder moves its resources at once."""
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.renewer, self.leases.delete, self.lease_name
            )
            log.info("left the shard ring: Lease %s deleted", self.lease_name)
        except Exception as exc:  # noqa: BLE001 - it expires instead
            log.warning("deleting the shard Lease %s failed: %s", self.lease_name, exc)
