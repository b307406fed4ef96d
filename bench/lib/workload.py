"""What the benchmark creates: one row per kind, the CRs, and the watch that follows them.

Every registered kind (provisioner.kinds.registry.KINDS) takes part, in the registry's order (its
place in --mix); its spec, the spec change the change phase makes and how to see that change
in the cloud come from its sample in provisioner_dev/samples.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.lib.listwatch import ListWatch, WatchApi
from provisioner import API_VERSION
from provisioner.kinds.registry import KINDS as REGISTERED
from provisioner_dev.cloud import DevCloud
from provisioner_dev.samples import SAMPLES, Sample

# A spec change: (merge patch, a check against the cloud that it arrived, the field's name).
Change = tuple[dict[str, Any], Callable[[], bool], str]


@dataclass(frozen=True)
class Kind:
    """One registered kind as the benchmark uses it (registry plus its dev sample)."""

    kind: str
    plural: str
    mix: str  # its name in --mix: the AWS service behind it
    prefix: str  # of the CRs' names
    service: str  # the AWS service behind it, as moto's recording names it
    left_key: str  # its count among the cloud resources left at the end
    sample: Sample

    @property
    def spec(self) -> dict[str, Any]:
        return self.sample.spec

    def change(self, cloud: DevCloud, status: dict[str, Any], i: int) -> Change:
        patch, value = self.sample.change(i)
        return patch, lambda: self.sample.shows(cloud, status, value), self.sample.change_field


TAGS = {"team": "bench"}
# In --mix order: the registry's.
KINDS: tuple[Kind, ...] = tuple(
    Kind(k.kind, k.plural, k.service, k.kind.lower(), k.service, k.plural, SAMPLES[k.kind])
    for k in REGISTERED
)
BY_KIND = {k.kind: k for k in KINDS}
PLURALS = {k.plural for k in KINDS}
MIX_NAMES = ":".join(k.mix for k in KINDS)


def split_mix(n: int, mix: str) -> dict[str, int]:
    """N split by the --mix weights (largest remainder), by kind."""
    try:
        weights = [float(w) for w in mix.split(":")]
    except ValueError:
        example = ":".join("1" for _ in KINDS)
        raise SystemExit(f"--mix {mix!r}: expected {len(KINDS)} numbers like {example}") from None
    if len(weights) != len(KINDS) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise SystemExit(f"--mix {mix!r}: expected {len(KINDS)} non-negative weights {MIX_NAMES}")
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(KINDS)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return {k.kind: counts[i] for i, k in enumerate(KINDS)}


@dataclass
class Cr:
    kind: str
    plural: str
    namespace: str
    name: str
    # Wall-clock bounds of the create request (for kubectl: of its whole batch).
    sent: float = 0.0
    returned: float = 0.0
    created_ok: bool = False
    uid: str = ""
    creation_ts: tuple[float, float] | None = None
    # Latest round (its time) that showed it not yet Ready; the lower bound for Ready.
    not_ready_at: float = 0.0
    ready_at: float | None = None
    ready_error: float | None = None
    seen_ready: float | None = None
    status: dict[str, Any] = field(default_factory=dict)
    resource_version: str = ""
    last_present: float = 0.0
    gone_at: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.plural, self.namespace, self.name)

    @property
    def created_at(self) -> float:
        """Best estimate of the create: [sent, returned] intersected with [cts, cts + 1)."""
        low, high = self.sent, self.returned
        if self.creation_ts is not None:
            low2, high2 = max(low, self.creation_ts[0]), min(high, self.creation_ts[1])
            if low2 <= high2:
                low, high = low2, high2
        return (low + high) / 2

    @property
    def time_to_ready(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.created_at

    @property
    def path(self) -> str:
        """Its collection; the object itself is `path/name`."""
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/{self.plural}"

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {**BY_KIND[self.kind].spec, "tags": TAGS},
        }


def plan(n: int, mix: str, namespaces: list[str], seed: int) -> list[Cr]:
    counts = split_mix(n, mix)
    kinds = [kind for kind, count in counts.items() for _ in range(count)]
    random.Random(seed).shuffle(kinds)
    return [
        Cr(
            kind,
            BY_KIND[kind].plural,
            namespaces[i % len(namespaces)],
            f"{BY_KIND[kind].prefix}-{i:05d}",
        )
        for i, kind in enumerate(kinds)
    ]


def ready_condition(item: dict[str, Any]) -> dict[str, Any] | None:
    for c in (item.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c
    return None


# Seconds between two rounds (reads of the watched cache) while waiting for Ready or deletion.
POLL_INTERVAL = 0.5


class Lister:
    """What the API server says of our CRs, kept by one LIST and then WATCH per kind in use
    (`ListWatch`: a thread each; LIST again after a WATCH error such as 410), never polled.

    A LIST of every CR every 0.5 s costs the API server and the bench work in proportion to
    N each time, so over a run whose length grows with N it costs N squared: at 10,000 CRs
    the polls alone took most of a core from the control plane the operator shares. The
    WATCH sends each status write once.

    `round()` reads the cache: for every one of our CRs that exists, (cr, item, as of, since):
    the item is what the API server said last, `as of` is now (the watch is current up to
    its delivery delay, milliseconds), `since` the time the version arrived. So "not Ready
    at `as of`" and "Ready by `since`" bound the transition the way a LIST's send and answer
    times did.
    """

    def __init__(self, api: WatchApi, crs: list[Cr]) -> None:
        self.by_key = {cr.key: cr for cr in crs}
        self.plurals = sorted({cr.plural for cr in crs})
        self.rounds = 0
        self._items: dict[tuple[str, str, str], tuple[dict[str, Any], float]] = {}
        self._lock = threading.Lock()
        self.watch = ListWatch(
            api,
            {plural: f"/apis/{API_VERSION}/{plural}" for plural in self.plurals},
            self._listed,
            self._event,
            thread_name="lister",
        )

    @property
    def lists(self) -> int:
        return self.watch.lists

    @property
    def list_seconds(self) -> float:
        return self.watch.list_seconds

    @property
    def events(self) -> int:
        return self.watch.events

    @property
    def errors(self) -> list[str]:
        return self.watch.errors

    def start(self, timeout: float = 60.0) -> None:
        """Start the watches; return once every kind was listed (RuntimeError if not)."""
        if not self.watch.start().wait_listed(timeout):
            raise RuntimeError(f"cannot list the CRs: {self.errors[:1]}")

    def stop(self) -> None:
        self.watch.stop()

    def round(self) -> list[tuple[Cr, dict[str, Any], float, float]]:
        """(cr, item, as of, since) for every one of our CRs that exists."""
        now = time.time()
        with self._lock:
            held = list(self._items.items())
        self.rounds += 1
        return [(self.by_key[key], item, now, since) for key, (item, since) in held]

    @staticmethod
    def _key(plural: str, item: dict[str, Any]) -> tuple[str, str, str]:
        meta = item.get("metadata") or {}
        return (plural, meta.get("namespace", ""), meta.get("name", ""))

    def _keep(self, plural: str, item: dict[str, Any], at: float) -> None:
        key = self._key(plural, item)
        if key not in self.by_key:
            return
        with self._lock:
            known = self._items.get(key)
            version = (item.get("metadata") or {}).get("resourceVersion")
            if known is not None and known[0]["metadata"].get("resourceVersion") == version:
                return
            self._items[key] = (item, at)

    def _listed(self, plural: str, items: list[dict[str, Any]], at: float) -> None:
        """A LIST's answer: what it holds, and nothing of that kind that it does not."""
        present = set()
        for item in items:
            present.add(self._key(plural, item))
            self._keep(plural, item, at)
        with self._lock:
            for key in [k for k in self._items if k[0] == plural and k not in present]:
                del self._items[key]

    def _event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            with self._lock:
                self._items.pop(self._key(plural, obj), None)
        else:
            self._keep(plural, obj, time.time())
