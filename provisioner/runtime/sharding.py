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
import bisect
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from provisioner import API_VERSION, GROUP
from provisioner.kinds.registry import KINDS
from provisioner.kube.client import Kube, KubeError

log = logging.getLogger(__name__)

SHARD_LABEL = f"sharding.{GROUP}/shard"
DRAIN_LABEL = f"sharding.{GROUP}/drain"
RING_LABEL = f"sharding.{GROUP}/ring"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class Ring:
    """A consistent-hash ring: each member owns `tokens` points; a key belongs to the member
    of the first point at or after the key's hash."""

    def __init__(self, members: Iterable[str], tokens: int = 128) -> None:
        self.members = frozenset(members)
        points = sorted((_hash(f"{m}#{i}"), m) for m in self.members for i in range(tokens))
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def owner(self, key: str) -> str | None:
        if not self._owners:
            return None
        i = bisect.bisect_left(self._hashes, _hash(key)) % len(self._hashes)
        return self._owners[i]


def key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


def owns(labels: Mapping[str, str] | None, shard: str) -> bool:
    """Whether a resource with `labels` is this shard's to act on (and not being drained)."""
    labels = labels or {}
    return labels.get(SHARD_LABEL) == shard and DRAIN_LABEL not in labels


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseClock:
    """When this process saw each Lease last renewed, by its own monotonic clock."""

    seen: dict[str, tuple[str, float]] = field(default_factory=dict)

    def observe(self, name: str, renew_time: str, now: float) -> float:
        """Record `renew_time` of Lease `name`; returns the monotonic time it was first seen."""
        known = self.seen.get(name)
        if known is None or known[0] != renew_time:
            self.seen[name] = (renew_time, now)
            return now
        return known[1]

    def forget_except(self, names: Iterable[str]) -> None:
        keep = set(names)
        for name in list(self.seen):
            if name not in keep:
                del self.seen[name]


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
        self.namespace = namespace
        self.ring = ring
        self.shard = shard
        self.lease_seconds = lease_seconds
        self.renew_seconds = max(1.0, lease_seconds / 7.5)
        self.deadline = lease_seconds * 2 / 3
        self.fence = fence or _exit
        self.namespaces = namespaces or []
        # Told how many replicas hold a Lease in the ring (at start, then about every 10 s):
        # the AWS call budget is shared between them.
        self.on_members = on_members
        # The Lease's renewals must never wait behind anything: a thread of their own. The
        # sharder's rounds and the hand-overs' label patches share two more.
        self.renewer = ThreadPoolExecutor(1, thread_name_prefix="shard-lease")
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="sharding")
        self.patcher = ThreadPoolExecutor(8, thread_name_prefix="shard-labels")
        self.clock = LeaseClock()
        self.renewed_at: float | None = None  # monotonic time the last good renewal was sent
        self.leading_until = 0.0
        self.led_at: float | None = None  # monotonic time the sharder Lease was last renewed
        self.listed_at: float | None = None  # monotonic time the members were last listed
        self.looked_at: float | None = None  # ... and the sharder Lease last read
        self.members: frozenset[str] = frozenset()
        self.owners: dict[str, int] = {}  # member -> resources labelled with it (full rounds)
        self.next_full = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    # -- membership ------------------------------------------------------------------

    @property
    def lease_name(self) -> str:
        return f"{self.ring}-shard-{self.shard}"

    @property
    def sharder_lease(self) -> str:
        return f"{self.ring}-sharder"

    def _leases(self, name: str = "") -> str:
        base = LEASES.format(namespace=self.namespace)
        return f"{base}/{name}" if name else base

    def _lease_body(self, name: str, existing: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_now()
        spec = dict((existing or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.shard:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if existing else 0
            )
        spec.update(
            holderIdentity=self.shard, leaseDurationSeconds=self.lease_seconds, renewTime=now
        )
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if existing:
            meta = dict(existing["metadata"])
        meta.setdefault("labels", {})
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _ring_leases(self) -> list[dict[str, Any]]:
        """The Leases of this ring's members (blocking)."""
        found = self.kube.request(
            "GET", self._leases(), query=[("labelSelector", f"{RING_LABEL}={self.ring}")]
        )
        return list((found or {}).get("items") or [])

    def renew_membership(self) -> None:
        """Create or renew this replica's Lease (a blocking call)."""
        name = self.lease_name
        existing = self.kube.request("GET", self._leases(name))
        body = self._lease_body(name, existing)
        body["metadata"]["labels"][RING_LABEL] = self.ring
        if existing is None:
            self.kube.request("POST", self._leases(), body)
        else:
            self.kube.request("PUT", self._leases(name), body)

    def count_members(self) -> int:
        """Replicas holding a Lease in the ring, dead ones not yet removed included (so a
        share computed from it errs on the small side); tells `on_members`."""
        count = sum(1 for i in self._ring_leases() if (i.get("spec") or {}).get("holderIdentity"))
        count = max(1, count)
        if self.on_members is not None:
            self.on_members(count)
        return count

    async def _renew(self) -> None:
        """Renew this replica's Lease; on success, it counts from when the request was sent."""
        sent = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(self.renewer, self.renew_membership)
        self.renewed_at = sent

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        rounds = 0
        while True:
            try:
                await self._renew()
            except Exception as exc:  # noqa: BLE001 - tried again; the watchdog decides
                log.warning("renewing the shard Lease %s failed: %s", self.lease_name, exc)
            rounds += 1
            if rounds % 5 == 0:
                try:
                    await loop.run_in_executor(self.executor, self.count_members)
                except Exception as exc:  # noqa: BLE001 - counted again later
                    log.debug("counting the shard members failed: %s", exc)
            await asyncio.sleep(self.renew_seconds)

    async def _watchdog(self) -> None:
        """Stop acting (exit) once the Lease has not been renewed for `deadline` seconds."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            last = self.renewed_at if self.renewed_at is not None else started
            if time.monotonic() - last > self.deadline:
                self.fence(
                    f"the shard Lease {self.namespace}/{self.lease_name} was not renewed for "
                    f"{self.deadline:.0f}s: stopping before another replica takes its resources"
                )
                return

    async def wait_member(self) -> None:
        """Return once this replica's Lease is held (before its watches start)."""
        loop = asyncio.get_running_loop()
        delay = 0.5
        while True:
            try:
                await self._renew()
                await loop.run_in_executor(self.executor, self.count_members)
                return
            except Exception as exc:  # noqa: BLE001 - the API server is not answering yet
                log.warning("creating the shard Lease %s failed: %s", self.lease_name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # -- the sharder -------------------------------------------------------------------

    def lead(self, now: float) -> bool:
        """Acquire or renew the sharder Lease; whether this replica is the sharder now."""
        if self.led_at is not None and now - self.led_at < self.renew_seconds:
            return True  # renewed a moment ago
        name = self.sharder_lease
        existing = self.kube.request("GET", self._leases(name))
        if self.looked_at is None or now - self.looked_at > 3 * self.renew_seconds:
            self.clock.seen.pop(name, None)  # the time it could not look does not count
        self.looked_at = now
        spec = (existing or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        if existing is not None and holder and holder != self.shard:
            first_seen = self.clock.observe(name, str(spec.get("renewTime")), now)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
            if now - first_seen < duration:
                self.led_at = None
                # The sharder has missed a renewal: this replica may take over soon, so it
                # starts timing the members' Leases now. Whoever dies with the sharder (a node
                # lost) then moves one Lease's duration after it, not two.
                if now - first_seen > 2 * self.renew_seconds + 1.0:
                    self.live_members(now)
                return False  # another replica leads, alive as far as this one has seen
        body = self._lease_body(name, existing)
        if existing is None:
            self.kube.request("POST", self._leases(), body)
        else:
            self.kube.request("PUT", self._leases(name), body)  # 409 if another won meanwhile
        if holder != self.shard:
            log.info("this replica (%s) is now the sharder", self.shard)
        self.led_at = now
        return True

    def live_members(self, now: float) -> tuple[frozenset[str], set[str], dict[str, str]]:
        """The live members, the dead ones, and each one's Lease name."""
        items = self._ring_leases()
        if self.listed_at is None or now - self.listed_at > 3 * self.renew_seconds:
            # This replica could not look for a while (the API server away, or it had not
            # been looking): no member counts as silent for the time it did not look. (The
            # sharder Lease has its own account, in `lead`.)
            self.clock.forget_except([self.sharder_lease])
        self.listed_at = now
        alive: set[str] = set()
        dead: set[str] = set()
        leases: dict[str, str] = {}
        for lease in items:
            name = lease["metadata"]["name"]
            spec = lease.get("spec") or {}
            member = str(spec.get("holderIdentity") or "")
            if not member:
                continue
            leases[member] = name
            first_seen = self.clock.observe(name, str(spec.get("renewTime")), now)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
            if member == self.shard or now - first_seen < duration:
                alive.add(member)
            else:
                dead.add(member)
        self.clock.forget_except([*leases.values(), self.sharder_lease])
        return frozenset(alive), dead, leases

    def _list(self, plural: str, selector: str | None) -> Iterator[dict[str, Any]]:
        """Every resource of `plural` (metadata only, paged), in the namespaces served."""
        bases = (
            [f"/apis/{API_VERSION}/namespaces/{ns}/{plural}" for ns in self.namespaces]
            if self.namespaces
            else [f"/apis/{API_VERSION}/{plural}"]
        )
        for base in bases:
            token = ""
            while True:
                query = [("limit", "500")]
                if selector:
                    # The unassigned, polled every second: from the API server's cache (a
                    # stale answer costs a 409 on the patch, never a wrong label).
                    query = [("labelSelector", selector), ("resourceVersion", "0")]
                if token:
                    query.append(("continue", token))
                page = self.kube.request("GET", base, query=query, accept=METADATA_LIST) or {}
                yield from page.get("items") or []
                token = (page.get("metadata") or {}).get("continue") or ""
                if not token:
                    break

    def _label(self, plural: str, meta: Mapping[str, Any], labels: dict[str, Any]) -> bool:
        path = f"/apis/{API_VERSION}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
        patch = {"metadata": {"labels": labels, "resourceVersion": meta["resourceVersion"]}}
        try:
            self.kube.request("PATCH", path, patch, content_type="application/merge-patch+json")
            return True
        except KubeError as exc:
            if exc.status in (404, 409):
                return False  # gone, or changed since listed: the next round decides again
            raise

    def assign(self, full: bool, ring: Ring, alive: frozenset[str]) -> dict[str, int]:
        """One round: label the unassigned (all resources when `full`); returns counts.

        The patches go out on several threads at once, in chunks: a burst of a thousand new
        resources is labelled in seconds, not one round trip after another."""
        counts = {"assigned": 0, "drained": 0, "moved": 0, "conflicts": 0, "incomplete": 0}
        owners: dict[str, int] = {}
        todo: list[tuple[str, str, Mapping[str, Any], dict[str, Any]]] = []
        for kind in KINDS:
            selector = None if full else f"!{SHARD_LABEL}"
            for item in self._list(kind.plural, selector):
                meta = item["metadata"]
                labels = meta.get("labels") or {}
                current = labels.get(SHARD_LABEL)
                wanted = ring.owner(key(kind.kind, meta["namespace"], meta["name"]))
                if wanted is None:
                    return counts
                if current:
                    owners[current] = owners.get(current, 0) + 1
                if current == wanted or (current in alive and DRAIN_LABEL in labels):
                    continue
                if current in alive:
                    todo.append(("drained", kind.plural, meta, {DRAIN_LABEL: "true"}))
                else:
                    what = "moved" if current else "assigned"
                    todo.append((what, kind.plural, meta, {SHARD_LABEL: wanted, DRAIN_LABEL: None}))
        for start in range(0, len(todo), 100):
            if time.monotonic() > self.leading_until:
                counts["incomplete"] = 1  # the sharder Lease is due: the next round goes on
                return counts
            chunk = todo[start : start + 100]
            done = self.patcher.map(lambda t: self._label(t[1], t[2], t[3]), chunk)
            for (what, *_), ok in zip(chunk, done, strict=True):
                counts[what if ok else "conflicts"] += 1
        if full:
            self.owners = owners
        return counts

    def shard_round(self, now: float) -> None:
        """One round of the sharder (blocking)."""
        try:
            leading = self.lead(now)
        except Exception:
            self.led_at = None
            raise
        if not leading:
            self.leading_until = 0.0
            return
        assert self.led_at is not None
        self.leading_until = self.led_at + self.deadline
        alive, dead, leases = self.live_members(now)
        if not alive:
            return
        changed = alive != self.members
        full = changed or now >= self.next_full
        if changed:
            log.info("shard members: %s", ", ".join(sorted(alive)))
        self.members = alive
        counts = self.assign(full, Ring(alive), alive)
        if full:
            # Changed meanwhile (409) or gone: decided again soon, not in 30 s.
            self.next_full = now + (2.0 if counts["conflicts"] else 30.0)
            if counts["incomplete"]:
                self.next_full = 0.0
            # A dead member's Lease goes once no resource is labelled with it any more.
            for member in dead if not counts["incomplete"] else ():
                if not self.owners.get(member):
                    try:
                        self.kube.request("DELETE", self._leases(leases[member]))
                    except KubeError as exc:
                        log.debug("deleting the Lease of %s: %s", member, exc)
        if counts["assigned"] or counts["moved"] or counts["drained"]:
            log.info(
                "sharding: %d assigned, %d moved from dead members, %d draining",
                counts["assigned"],
                counts["moved"],
                counts["drained"],
            )

    async def _shard_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.executor, self.shard_round, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("sharding round failed: %s", exc)
            await asyncio.sleep(1.0)

    # -- the owner's side of a handover --------------------------------------------------

    def release(self, plural: str, namespace: str, name: str, uid: str) -> None:
        """Remove the shard and drain labels (blocking): the sharder assigns it again."""
        path = f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}/{name}"
        patch = {"metadata": {"labels": {SHARD_LABEL: None, DRAIN_LABEL: None}, "uid": uid}}
        self.kube.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for coro, name in (
            (self._renew_loop(), "shard-lease"),
            (self._watchdog(), "shard-watchdog"),
            (self._shard_loop(), "sharder"),
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
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self.renewer, self.kube.request, "DELETE", self._leases(self.lease_name)
                )
                log.info("left the shard ring: Lease %s deleted", self.lease_name)
            except Exception as exc:  # noqa: BLE001 - it expires instead
                log.warning("deleting the shard Lease %s failed: %s", self.lease_name, exc)
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
