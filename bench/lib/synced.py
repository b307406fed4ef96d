"""Every Synced=False a custom resource shows during a run, seen with one WATCH per kind.

A LIST every 0.5 s misses a condition that is written and replaced between two polls; a
WATCH sees every status write. Each time a CR's Synced condition turns False, or keeps False
with another reason or message, one entry is kept, with the phase of the run it was seen in
and its class (`classify`): throttling, an injected fault, a busy resource, ...
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.lib.listwatch import ListWatch, WatchApi
from provisioner import API_VERSION

# (class, pattern over the condition's reason and message), the first that matches wins.
CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The fault proxy's answers say "injected" (its throttles too): faults asked for.
    ("injected fault", re.compile(r"injected", re.I)),
    (
        "throttling",
        re.compile(
            r"Throttl|RequestThrottled|SlowDown|Rate exceeded|TooManyRequests|"
            r"RequestLimitExceeded|PriorRequestNotComplete",
            re.I,
        ),
    ),
    # A change the cloud cannot take while the resource is busy (RDS creating, modifying).
    (
        "resource busy",
        re.compile(r"InvalidDBInstanceState|not in available state|instance is [\w-]+; will retry"),
    ),
    ("change not applied yet", re.compile(r"the cloud has not applied")),
    ("Kubernetes API", re.compile(r"Kubernetes API call failed")),
    (
        "connection or 5xx",
        re.compile(
            r"connect|timed? ?out|RemoteDisconnected|InternalError|ServiceUnavailable|"
            r"InternalFailure|\b5\d\d\b",
            re.I,
        ),
    ),
)


def classify(reason: str, message: str) -> str:
    text = f"{reason}: {message}"
    for name, pattern in CLASSES:
        if pattern.search(text):
            return name
    return "other"


@dataclass
class Seen:
    kind: str
    name: str  # namespace/name
    reason: str
    message: str
    phase: str
    at: float  # seconds since the watch started
    cls: str


class SyncedWatch:
    """One LIST-then-WATCH per kind (`ListWatch`, a thread each), for the whole run."""

    def __init__(
        self,
        api: WatchApi,
        plurals: list[str],
        wanted: Callable[[str, str], bool] = lambda namespace, name: True,
    ) -> None:
        self.plurals = plurals
        self.wanted = wanted
        self.phase = "start"
        self.seen: list[Seen] = []
        self.events = 0
        self._last: dict[tuple[str, str], tuple[str, str] | None] = {}
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.watch = ListWatch(
            api,
            {plural: f"/apis/{API_VERSION}/{plural}" for plural in plurals},
            self._listed,
            self._event,
            thread_name="watch",
            pause=1.0,
        )

    @property
    def errors(self) -> list[str]:
        return self.watch.errors

    @property
    def restarts(self) -> int:
        return self.watch.restarts

    def start(self) -> SyncedWatch:
        self._started = time.monotonic()
        self.watch.start()
        return self

    def wait_listed(self, timeout: float = 30.0) -> bool:
        """Whether every kind was listed (and so is watched) within `timeout`."""
        return self.watch.wait_listed(timeout)

    def stop(self) -> None:
        self.watch.stop()

    def _listed(self, plural: str, items: list[dict[str, Any]], at: float) -> None:
        for item in items:
            self._look(plural, item)

    def _event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            with self._lock:
                self._last.pop((meta.get("namespace", ""), meta.get("name", "")), None)
        else:
            self._look(plural, obj)

    def _look(self, plural: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if not self.wanted(namespace, name):
            return
        synced = next(
            (
                c
                for c in (obj.get("status") or {}).get("conditions") or []
                if c.get("type") == "Synced"
            ),
            None,
        )
        with self._lock:
            self.events += 1
            key = (namespace, name)
            if synced is None or synced.get("status") != "False":
                self._last[key] = None
                return
            reason, message = str(synced.get("reason", "")), str(synced.get("message", ""))
            if self._last.get(key) == (reason, message):
                return
            self._last[key] = (reason, message)
            self.seen.append(
                Seen(
                    kind=obj.get("kind", plural),
                    name=f"{namespace}/{name}",
                    reason=reason,
                    message=message,
                    phase=self.phase,
                    at=round(time.monotonic() - self._started, 2),
                    cls=classify(reason, message),
                )
            )

    def summary(self, samples: int = 3) -> dict[str, Any]:
        """Counts by class and by phase, and a few messages of each class."""
        with self._lock:
            seen = list(self.seen)
        by_class = Counter(s.cls for s in seen)
        examples: dict[str, list[dict[str, Any]]] = {}
        for s in seen:
            bucket = examples.setdefault(s.cls, [])
            if len(bucket) < samples and all(e["message"] != s.message for e in bucket):
                bucket.append(asdict(s))
        return {
            "total": len(seen),
            "throttling": by_class.get("throttling", 0),
            "by_class": dict(by_class.most_common()),
            "by_phase": dict(Counter(s.phase for s in seen)),
            "crs": len({(s.kind, s.name) for s in seen}),
            "examples": examples,
            "watch_events": self.events,
            "watch_restarts": self.restarts,
            "watch_errors": list(self.errors),
            "all": [asdict(s) for s in seen[:2000]],
        }


def describe(summary: dict[str, Any]) -> str:
    """`0 throttling; 14 other (resource busy 12, change not applied yet 2)`."""
    others = {k: v for k, v in summary["by_class"].items() if k != "throttling"}
    text = f"{summary['throttling']} throttling; {sum(others.values())} other"
    if others:
        text += " (" + ", ".join(f"{k} {v}" for k, v in others.items()) + ")"
    return text
