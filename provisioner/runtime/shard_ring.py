"""A shard ring's names and Leases: the labels on the resources, the consistent-hash ring,
and the Leases (coordination.k8s.io) its members and its sharder hold."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from provisioner import GROUP
from provisioner.kube.client import Kube

SHARD_LABEL = f"sharding.{GROUP}/shard"
DRAIN_LABEL = f"sharding.{GROUP}/drain"
RING_LABEL = f"sharding.{GROUP}/ring"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


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


@dataclass(frozen=True)
class RingLeases:
    """The Leases of ring `ring` in `namespace`, as this replica (`shard`) holds them. All its
    calls block."""

    kube: Kube
    namespace: str
    ring: str
    shard: str
    lease_seconds: int = 15

    @property
    def renew_seconds(self) -> float:
        return max(1.0, self.lease_seconds / 7.5)

    @property
    def deadline(self) -> float:
        """How long this replica acts without a renewal of its Lease: two thirds of it."""
        return self.lease_seconds * 2 / 3

    @property
    def lease_name(self) -> str:
        return f"{self.ring}-shard-{self.shard}"

    @property
    def sharder_lease(self) -> str:
        return f"{self.ring}-sharder"

    def path(self, name: str = "") -> str:
        base = LEASES.format(namespace=self.namespace)
        return f"{base}/{name}" if name else base

    def body(self, name: str, existing: dict[str, Any] | None) -> dict[str, Any]:
        """Lease `name` held (or renewed) by this replica, from its current state."""
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

    def get(self, name: str) -> dict[str, Any] | None:
        return self.kube.request("GET", self.path(name))

    def write(self, name: str, existing: dict[str, Any] | None, body: dict[str, Any]) -> None:
        """Create Lease `name`, or replace `existing` (409 if another replica wrote it since)."""
        if existing is None:
            self.kube.request("POST", self.path(), body)
        else:
            self.kube.request("PUT", self.path(name), body)

    def delete(self, name: str) -> None:
        self.kube.request("DELETE", self.path(name))

    def members(self) -> list[dict[str, Any]]:
        """The Leases of this ring's members."""
        found = self.kube.request(
            "GET", self.path(), query=[("labelSelector", f"{RING_LABEL}={self.ring}")]
        )
        return list((found or {}).get("items") or [])
