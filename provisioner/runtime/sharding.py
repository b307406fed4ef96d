"""Sharding: several replicas split the resources between them, on Kubernetes itself.

- **Membership.** Each replica holds a Lease (coordination.k8s.io) in its namespace, labelled
  `sharding.cloud.provisioner.dev/ring: <ring>`, renewed every `renew_seconds`. A replica that
  has not renewed it for `deadline` seconds (two thirds of the Lease's duration) stops: it
  exits, as a controller that loses its leader Lease does, before anyone may count it dead.
- **Assignment.** One replica, elected through the Lease `<ring>-sharder`, is the sharder: it
  labels every resource `sharding.cloud.provisioner.dev/shard: <replica>`, the replica a
  consistent-hash ring of the live members gives for its kind, namespace and name. A member
  joining or leaving moves about 1/N of the resources, not all of them.
- **Each replica acts on its shard only**: its watches carry the label selector
  `shard=<its name>` (server side), so it neither sees nor holds the others' resources.
- **Handover.** A resource whose owner is alive is moved in two steps: the sharder labels it
  `sharding.cloud.provisioner.dev/drain`; the owner, once no pass of that resource is in flight
  (it takes the resource's lock) and its resync is forgotten, removes both labels; the sharder
  then gives it to the new owner. A resource whose owner is dead (its Lease not renewed for
  the Lease's duration, as the sharder has observed it: its own clock, not the timestamp, so
  clock skew between nodes does not count) is relabelled at once: the owner stopped acting at
  two thirds of that time. So two replicas never act on one resource at once. A replica that
  sees the sharder miss its renewals times the members' Leases too, so that the replicas that
  die with the sharder move one Lease's duration later, not two.

Every patch of the sharder carries the resourceVersion it decided on: a resource changed
meanwhile is decided again on the next round, never overwritten.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from provisioner import API_VERSION
from provisioner.kube.client import Kube
from provisioner.runtime.shard_member import Membership
from provisioner.runtime.shard_ring import DRAIN_LABEL as DRAIN_LABEL
from provisioner.runtime.shard_ring import RING_LABEL as RING_LABEL
from provisioner.runtime.shard_ring import SHARD_LABEL as SHARD_LABEL
from provisioner.runtime.shard_ring import LeaseClock as LeaseClock
from provisioner.runtime.shard_ring import Ring as Ring
from provisioner.runtime.shard_ring import RingLeases
from provisioner.runtime.shard_ring import key as key
from provisioner.runtime.shard_ring import owns as owns
from provisioner.runtime.sharder import Sharder

log = logging.getLogger(__name__)


class Shards:
    """This replica's part: its membership Lease, and the sharder when elected."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        ring: str,
        shard: str,
        lease_seconds: int = 15,
        fence: Callable[[str], None] | None = None,
        namespaces: list[str] | None = None,
        on_members: Callable[[int], None] | None = None,
    ) -> None:
        self.kube = kube
        self.leases = RingLeases(kube, namespace, ring, shard, lease_seconds)
        # The Lease's renewals must never wait behind anything: a thread of their own. The
        # sharder's rounds and the hand-overs' label patches share two more.
        self.renewer = ThreadPoolExecutor(1, thread_name_prefix="shard-lease")
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="sharding")
        self.patcher = ThreadPoolExecutor(8, thread_name_prefix="shard-labels")
        self.membership = Membership(
            self.leases, self.renewer, self.executor, fence or _exit, on_members
        )
        self.sharder = Sharder(self.leases, self.patcher, namespaces)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def lease_name(self) -> str:
        return self.leases.lease_name

    async def wait_member(self) -> None:
        """Return once this replica's Lease is held (before its watches start)."""
        await self.membership.wait_member()

    def release(self, plural: str, namespace: str, name: str, uid: str) -> None:
        """Remove the shard and drain labels (blocking): the sharder assigns it again."""
        path = f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}/{name}"
        patch = {"metadata": {"labels": {SHARD_LABEL: None, DRAIN_LABEL: None}, "uid": uid}}
        self.kube.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for coro, name in (
            (self.membership.renew_loop(), "shard-lease"),
            (self.membership.watchdog(), "shard-watchdog"),
            (self.sharder.run(self.executor), "sharder"),
        ):
            self._tasks.append(loop.create_task(coro, name=name))

    async def stop(self, leave: bool = True) -> None:
        """Stop renewing. `leave` (nothing of this replica's is in flight any more): delete
        the Lease, so that the sharder moves this replica's resources at once; otherwise
        they move when it expires."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if leave:
            await self.membership.leave()
        else:
            log.warning(
                "cloud calls still in flight: the shard Lease %s is left to expire",
                self.lease_name,
            )
        self.executor.shutdown(wait=False)
        self.patcher.shutdown(wait=False)
        self.renewer.shutdown(wait=False)


def _exit(message: str) -> None:
    log.error("%s", message)
    logging.shutdown()
    os._exit(3)
