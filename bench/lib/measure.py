"""Figures: percentiles, times, /proc, the API server's write counters, the operator's source."""

from __future__ import annotations

import hashlib
import os
import re
import resource
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lib.workload import PLURALS
from provisioner import GROUP
from provisioner_dev.kubejson import KubeJson
from provisioner_dev.launch import Stack

ROOT = Path(__file__).resolve().parents[2]
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}


def parse_time(value: str | None) -> tuple[float, float] | None:
    """An RFC 3339 timestamp as the interval it stands for: [t, t + 1 s) for whole seconds."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    start = moment.timestamp()
    return start, start + (1.0 if "." not in value else 0.001)


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# -- processes ----------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int | None) -> float | None:
    """utime + stime + cutime + cstime of a process, in seconds."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def proc_status_kib(pid: int | None, key: str) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def self_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def operator_pid(stack: Stack) -> int | None:
    op = stack.operator
    return op.proc.pid if op is not None and op.proc is not None else None


def cpu_snapshot(stack: Stack) -> dict[str, float]:
    """CPU seconds so far of every process of the stack, and of the bench itself."""
    out = {name: proc_cpu_seconds(pid) for name, pid in stack.pids().items()}
    snapshot = {k: v for k, v in out.items() if v is not None}
    snapshot["bench"] = self_cpu_seconds()
    return snapshot


def source_fingerprint() -> dict[str, Any]:
    """Which operator code ran: a hash of provisioner/**/*.py and crds/, and the newest file."""
    files = sorted([*ROOT.glob("provisioner/**/*.py"), *ROOT.glob("crds/*.yaml")])
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    newest = max(files, key=lambda f: f.stat().st_mtime, default=None)
    return {
        "sha256": digest.hexdigest()[:12],
        "files": len(files),
        "newest": str(newest.relative_to(ROOT)) if newest else None,
        "newest_mtime": datetime.fromtimestamp(newest.stat().st_mtime, UTC).isoformat(
            timespec="seconds"
        )
        if newest
        else None,
    }


# -- API server writes ----------------------------------------------------------------------------

# (group, resource, subresource, verb, code) -> count
WriteCounts = Counter[tuple[str, str, str, str, str]]
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _samples(text: str, metric: str) -> Iterable[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `metric` in Prometheus text format."""
    prefix = metric + "{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels_text, _, value = line[len(prefix) :].rpartition("} ")
            yield dict(LABEL.findall(labels_text)), float(value)


def scrape_writes(api: KubeJson) -> WriteCounts:
    """apiserver_request_total for the write verbs, from the API server's /metrics."""
    counts: WriteCounts = Counter()
    for labels, value in _samples(api.text("/metrics"), "apiserver_request_total"):
        if labels.get("verb") not in WRITE_VERBS:
            continue
        key = (
            labels.get("group", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
            labels["verb"],
            labels.get("code", ""),
        )
        counts[key] += int(value)
    return counts


def watching(api: KubeJson) -> set[str]:
    """The CR plurals that have at least one WATCH open (the operator's informers)."""
    try:
        text = api.text("/metrics")
    except RuntimeError:
        return set()
    return {
        labels.get("resource", "")
        for labels, value in _samples(text, "apiserver_longrunning_requests")
        if labels.get("verb") == "WATCH" and labels.get("group") == GROUP and value
    }


def write_delta(before: WriteCounts, after: WriteCounts) -> WriteCounts:
    delta: WriteCounts = Counter()
    for key in set(before) | set(after):
        n = after.get(key, 0) - before.get(key, 0)
        if n:
            delta[key] = n
    return delta


def _category(group: str, res: str, sub: str, verb: str) -> str:
    if group == GROUP and res in PLURALS:
        if sub == "status":
            return "cr_status"
        return "cr_client" if verb in ("POST", "DELETE", "DELETECOLLECTION") else "cr"
    if group in ("", "events.k8s.io") and res == "events":
        return "event"
    if group == "" and res == "secrets":
        return "secret"
    return "other"


def categorize(delta: WriteCounts, client_patches: int = 0) -> dict[str, Any]:
    """Writes by who/what: the operator's (CR, CR status, Secret, Event) and everything else.

    The bench itself only POSTs, PATCHes (spec changes) and DELETECOLLECTIONs the CRs'
    main resource and POSTs namespaces; the operator never POSTs or deletes a CR, so the
    CR writes with those verbs are the bench's ("cr_client"), and so are the
    `client_patches` spec PATCHes it says it made.
    """
    out: Counter[str] = Counter()
    other: Counter[str] = Counter()
    by_verb: Counter[str] = Counter()
    by_resource: Counter[str] = Counter()
    errors = 0
    for (group, res, sub, verb, code), n in delta.items():
        by_resource[f"{res}{'/' + sub if sub else ''} {verb}"] += n
        cat = _category(group, res, sub, verb)
        if cat == "other":
            other[f"{res}{'/' + sub if sub else ''} {verb}"] += n
        out[cat] += n
        if cat != "other":
            by_verb[f"{cat} {verb}"] += n
        if code and not code.startswith("2") and cat != "other":
            errors += n
    if client_patches:
        out["cr"] -= client_patches
        out["cr_client"] += client_patches
        by_verb["cr PATCH"] -= client_patches
        by_verb["cr_client PATCH"] += client_patches
    operator = out["cr"] + out["cr_status"] + out["secret"] + out["event"]
    return {
        "operator_total": operator,
        "cr": out["cr"],
        "cr_status": out["cr_status"],
        "secret": out["secret"],
        "event": out["event"],
        "cr_client": out["cr_client"],
        "other_total": out["other"],
        "other": dict(sorted(other.items())),
        "by_verb": {k: v for k, v in sorted(by_verb.items()) if v},
        # Every writer, by the metric's resource/subresource and verb.
        "by_resource": dict(sorted(by_resource.items())),
        "failed_non_2xx": errors,
    }


def operator_writes(counts: WriteCounts) -> int:
    return categorize(counts)["operator_total"]
