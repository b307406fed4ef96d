"""The sharder: the one replica, elected through the Lease `<ring>-sharder`, that labels every
resource with the member of the ring that owns it, and drains or moves it when that member
changes. Every patch carries the resourceVersion it decided on: a resource changed meanwhile
is decided again on the next round, never overwritten."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from typing import Any

from provisioner import API_VERSION
from provisioner.kinds.registry import KINDS
from provisioner.kube.client import KubeError
from provisioner.runtime.shard_ring import (
    DRAIN_LABEL,
    SHARD_LABEL,
    LeaseClock,
    Ring,
    RingLeases,
    key,
)

log = logging.getLogger(__name__)

METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


# The sharders of this process (one, when sharding is on), for the metrics.
ACTIVE: weakref.WeakSet[Sharder] = weakref.WeakSet()


class Sharder:
    """The sharder's rounds, on whichever replica holds the sharder Lease. The label patches
    go out on `patcher`'s threads."""

    def __init__(
        self, leases: RingLeases, patcher: Executor, namespaces: list[str] | None = None
    ) -> None:
        self.leases = leases
        self.patcher = patcher
        self.namespaces = namespaces or []
        self.clock = LeaseClock()
        self.leading_until = 0.0
        self.led_at: float | None = None  # monotonic time the sharder Lease was last renewed
        self.listed_at: float | None = None  # monotonic time the members were last listed
        self.looked_at: float | None = None  # ... and the sharder Lease last read
        self.members: frozenset[str] = frozenset()
        self.owners: dict[str, int] = {}  # member -> resources labelled with it (full rounds)
        # Resources the last full round found with no live owner (unlabelled, or labelled
        # with a dead member), before it labelled them: the metric of shards left unowned.
        self.unowned = 0
        self.next_full = 0.0
        ACTIVE.add(self)

    def leading(self, now: float) -> bool:
        """Whether this replica holds the sharder Lease as of its last round."""
        return now < self.leading_until

    @property
    def shard(self) -> str:
        return self.leases.shard

    def lead(self, now: float) -> bool:
        """Acquire or renew the sharder Lease; whether this replica is the sharder now."""
        renew_seconds = self.leases.renew_seconds
        if self.led_at is not None and now - self.led_at < renew_seconds:
            return True  # renewed a moment ago
        name = self.leases.sharder_lease
        existing = self.leases.get(name)
        if self.looked_at is None or now - self.looked_at > 3 * renew_seconds:
            self.clock.seen.pop(name, None)  # the time it could not look does not count
        self.looked_at = now
        spec = (existing or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        if existing is not None and holder and holder != self.shard:
            first_seen = self.clock.observe(name, str(spec.get("renewTime")), now)
            duration = float(spec.get("leaseDurationSeconds") or self.leases.lease_seconds)
            if now - first_seen < duration:
                self.led_at = None
                # The sharder has missed a renewal: this replica may take over soon, so it
                # starts timing the members' Leases now. Whoever dies with the sharder (a node
                # lost) then moves one Lease's duration after it, not two.
                if now - first_seen > 2 * renew_seconds + 1.0:
                    self.live_members(now)
                return False  # another replica leads, alive as far as this one has seen
        self.leases.write(name, existing, self.leases.body(name, existing))
        if holder != self.shard:
            log.info("this replica (%s) is now the sharder", self.shard)
        self.led_at = now
        return True

    def live_members(self, now: float) -> tuple[frozenset[str], set[str], dict[str, str]]:
        """The live members, the dead ones, and each one's Lease name."""
        items = self.leases.members()
        sharder_lease = self.leases.sharder_lease
        if self.listed_at is None or now - self.listed_at > 3 * self.leases.renew_seconds:
            # This replica could not look for a while (the API server away, or it had not
            # been looking): no member counts as silent for the time it did not look. (The
            # sharder Lease has its own account, in `lead`.)
            self.clock.forget_except([sharder_lease])
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
            duration = float(spec.get("leaseDurationSeconds") or self.leases.lease_seconds)
            if member == self.shard or now - first_seen < duration:
                alive.add(member)
            else:
                dead.add(member)
        self.clock.forget_except([*leases.values(), sharder_lease])
        return frozenset(alive), dead, leases

    def _list(self, plural: str, selector: str | None) -> Iterator[dict[str, Any]]:
        """Every resource of `plural` (metadata only, paged), in the namespaces served."""
        bases = (
            [f"/apis/{API_VERSION}/namespaces/{ns}/{plural}" for ns in self.namespaces]
            if self.namespaces
            else [f"/apis/{API_VERSION}/{plural}"]
        )
        kube = self.leases.kube
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
                page = kube.request("GET", base, query=query, accept=METADATA_LIST) or {}
                yield from page.get("items") or []
                token = (page.get("metadata") or {}).get("continue") or ""
                if not token:
                    break

    def _label(self, plural: str, meta: Mapping[str, Any], labels: dict[str, Any]) -> bool:
        path = f"/apis/{API_VERSION}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
        patch = {"metadata": {"labels": labels, "resourceVersion": meta["resourceVersion"]}}
        try:
            self.leases.kube.request(
                "PATCH", path, patch, content_type="application/merge-patch+json"
            )
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
        unowned = 0
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
                unowned += current not in alive
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
            self.owners, self.unowned = owners, unowned
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
            self.unowned = 0
            return
        assert self.led_at is not None
        self.leading_until = self.led_at + self.leases.deadline
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
            self._remove_dead(dead, leases, counts)
        if counts["assigned"] or counts["moved"] or counts["drained"]:
            log.info(
                "sharding: %d assigned, %d moved from dead members, %d draining",
                counts["assigned"],
                counts["moved"],
                counts["drained"],
            )

    def _remove_dead(self, dead: set[str], leases: dict[str, str], counts: dict[str, int]) -> None:
        """A dead member's Lease goes once no resource is labelled with it any more."""
        for member in dead if not counts["incomplete"] else ():
            if not self.owners.get(member):
                try:
                    self.leases.delete(leases[member])
                except KubeError as exc:
                    log.debug("deleting the Lease of %s: %s", member, exc)

    async def run(self, executor: Executor) -> None:
        """A round every second, each on `executor`."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(executor, self.shard_round, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("sharding round failed: %s", exc)
            await asyncio.sleep(1.0)
