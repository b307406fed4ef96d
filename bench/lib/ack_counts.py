"""What bench/ack.py measures of a controller: moto's recorded requests grouped by the
bucket each names, its API writes by category, and its memory (/proc/<pid>/status)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.lib.measure import WriteCounts, percentile, proc_status_kib
from bench.lib.recording import BENCH_USER_AGENT, Recording

RSS_INTERVAL = 0.2


def bucket_of(url: str, endpoint_host: str) -> str | None:
    """The bucket an S3 request names: virtual-hosted (`name.<endpoint host>`), else the first
    path segment (path style); None for a request naming none (ListBuckets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if endpoint_host and host.endswith("." + endpoint_host):
        return host[: -len(endpoint_host) - 1]
    segment = parts.path.lstrip("/").split("/", 1)[0]
    return segment or None


def calls_by_bucket(
    entries: Iterable[dict[str, Any]], recording: Recording, endpoint_host: str
) -> dict[str, Any]:
    """moto's recorded requests (the bench's own left out) grouped by the bucket they name:
    per bucket, the count and the actions; the requests naming none apart."""
    per_bucket: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    unnamed: Counter[str] = Counter()
    by_service: Counter[str] = Counter()
    for entry in entries:
        headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
        if BENCH_USER_AGENT in headers.get("user-agent", ""):
            continue
        service, action = recording.classify(entry, headers)
        x_id = parse_qs(urlsplit(entry.get("url", "")).query).get("x-id")
        if service == "s3" and x_id:
            action = x_id[0]  # the SDK for Go names its operation: ?x-id=ListBuckets
        by_service[service] += 1
        name = bucket_of(entry.get("url", ""), endpoint_host) if service == "s3" else None
        if name is None:
            unnamed[f"{service}:{action}"] += 1
        else:
            per_bucket[name] += 1
            actions[f"{service}:{action}"] += 1
    counts = sorted(per_bucket.values())
    return {
        "total": sum(by_service.values()),
        "by_service": dict(sorted(by_service.items())),
        "buckets_named": len(per_bucket),
        "naming_a_bucket": sum(counts),
        "per_named_bucket": {
            "min": counts[0] if counts else None,
            "p50": percentile(counts, 50),
            "max": counts[-1] if counts else None,
        },
        "by_action": dict(actions.most_common()),
        "naming_no_bucket": dict(unnamed.most_common()),
    }


def read_entries(path: Path, start: int, end: int) -> list[dict[str, Any]]:
    """The JSON lines of moto's recording between two offsets."""
    if end <= start or not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(start)
        data = f.read(end - start)
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def api_writes(delta: WriteCounts, group: str, plural: str) -> dict[str, Any]:
    """The controller's API writes: to its CRs (not the bench's POSTs and DELETEs), their
    status, Secrets and Events; the rest by resource and verb."""
    out: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for (g, res, sub, verb, _code), n in delta.items():
        if g == group and res == plural:
            if verb in ("POST", "DELETE", "DELETECOLLECTION"):
                continue
            out["cr_status" if sub == "status" else "cr"] += n
        elif res == "events" and g in ("", "events.k8s.io"):
            out["event"] += n
        elif res == "secrets" and g == "":
            out["secret"] += n
        else:
            other[f"{res}{'/' + sub if sub else ''} {verb}"] += n
    return {
        "total": sum(out.values()),
        **{k: out[k] for k in ("cr", "cr_status", "secret", "event")},
        "other": dict(sorted(other.items())),
    }


def mb(kib: float | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def rss_split(pid: int | None) -> dict[str, float | None]:
    """VmRSS as the kernel splits it: anonymous memory (heaps, stacks) and file-backed pages
    (the executable and shared libraries touched), from /proc/<pid>/status."""
    return {
        key: mb(proc_status_kib(pid, key)) for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    }


class RssSampler:
    """VmRSS of one process every `interval` seconds, in a thread."""

    def __init__(self, pid: int, interval: float = RSS_INTERVAL) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            kib = proc_status_kib(self.pid, "VmRSS")
            if kib:
                self.samples.append((round(time.monotonic() - self.t0, 2), kib))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def max_between(self, start: float, end: float) -> int | None:
        values = [kib for t, kib in self.samples if start <= t <= end]
        return max(values) if values else None
