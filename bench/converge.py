#!/usr/bin/env python3
"""Convergence benchmark: N custom resources from nothing to Ready, idle, changed, and gone.

Starts its own control plane (etcd, kube-apiserver, kube-controller-manager), moto's server
(with its request recorder on) and the operator as a child process, then:

1. create   N CRs across --namespaces namespaces as fast as the client can, and wait (LIST
            polls every 0.5 s, no per-object GETs) until every one is Ready;
2. idle     --idle seconds doing nothing, counting the API server's writes;
3. change   --changes random CRs get a mutable spec field patched; per change, the time from
            the patch returning to moto reflecting it;
4. delete   all of them, wait until every CR is gone, count what is left in moto.

It reads kube-apiserver's own `apiserver_request_total` for the writes, moto's recording for the
AWS calls, and /proc for the operator's peak RSS and CPU time, then prints one table (and
--json PATH). Exit status 1 if cloud resources are left, a create failed, or a phase timed out;
130 on Ctrl-C. Everything it started is stopped at the end unless --keep.

    .venv/bin/python bench/converge.py --n 1000 --namespaces 10 --mix 1:1:1 --idle 60

See bench/README.md for what each figure means and the targets.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.config
import kubernetes
import yaml

from provisioner_dev.binaries import ensure_binaries
from provisioner_dev.controlplane import ControlPlane
from provisioner_dev.stack import (
    DEV_CREDENTIALS,
    DEV_REGION,
    MotoServer,
    OperatorProcess,
    install_crds,
)

GROUP = "cloud.provisioner.dev"
API_VERSION = f"{GROUP}/v1alpha1"
# --mix order: db:s3:sqs
KINDS = (
    ("db", "DatabaseInstance", "databaseinstances"),
    ("s3", "S3Bucket", "s3buckets"),
    ("sqs", "Queue", "queues"),
)
PLURALS = {plural for _, _, plural in KINDS}
SPECS: dict[str, dict[str, Any]] = {
    "DatabaseInstance": {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "allocatedStorageGiB": 20,
        "tags": {"team": "bench"},
    },
    "S3Bucket": {"tags": {"team": "bench"}},
    "Queue": {"visibilityTimeoutSeconds": 30, "tags": {"team": "bench"}},
}
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}
BENCH_USER_AGENT = "provisioner-bench"
POLL_INTERVAL = 0.5
HASH_ANNOTATION = f"{GROUP}/content-hash"


class Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


# -- small helpers ----------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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


def source_fingerprint() -> dict[str, Any]:
    """Which operator code ran: a hash of provisioner/**/*.py and crds/, and the newest file."""
    root = Path(__file__).resolve().parents[1]
    files = sorted([*root.glob("provisioner/**/*.py"), *root.glob("crds/*.yaml")])
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    newest = max(files, key=lambda f: f.stat().st_mtime, default=None)
    return {
        "sha256": digest.hexdigest()[:12],
        "files": len(files),
        "newest": str(newest.relative_to(root)) if newest else None,
        "newest_mtime": datetime.fromtimestamp(newest.stat().st_mtime, UTC).isoformat(
            timespec="seconds"
        )
        if newest
        else None,
    }


def split_mix(n: int, mix: str) -> dict[str, int]:
    """N split by the db:s3:sqs weights (largest remainder)."""
    try:
        weights = [float(w) for w in mix.split(":")]
    except ValueError:
        raise SystemExit(f"--mix {mix!r}: expected three numbers like 1:1:1") from None
    if len(weights) != len(KINDS) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise SystemExit(f"--mix {mix!r}: expected three non-negative weights db:s3:sqs")
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(KINDS)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return {kind: counts[i] for i, (_, kind, _) in enumerate(KINDS)}


# -- the Kubernetes API, as plain JSON ----------------------------------------------------------


class Api:
    """The kubernetes client's transport with plain dicts (no model (de)serialisation)."""

    def __init__(self, kubeconfig: Path, pool_size: int = 32) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
        config.connection_pool_maxsize = pool_size
        self.client = kubernetes.client.ApiClient(config)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 60,
    ) -> tuple[int, bytes]:
        method, url, headers, body, post = self.client.param_serialize(
            method,
            path,
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(method, url, headers, body, post, _request_timeout=timeout)
        except kubernetes.client.exceptions.ApiException as exc:
            return int(exc.status or 0), str(exc.body or exc.reason).encode()
        return resp.status, resp.read()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        status, data = self.request(method, path, body, **kw)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data) if data else {}

    def list_items(self, path: str) -> list[dict[str, Any]]:
        return self.json("GET", path).get("items") or []


# -- API server writes ---------------------------------------------------------------------------

# (group, resource, subresource, verb, code) -> count
WriteCounts = Counter[tuple[str, str, str, str, str]]
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape_writes(api: Api) -> WriteCounts:
    """apiserver_request_total for the write verbs, from the API server's /metrics."""
    status, data = api.request("GET", "/metrics", accept="text/plain")
    if status != 200:
        raise RuntimeError(f"GET /metrics: {status}")
    counts: WriteCounts = Counter()
    prefix = "apiserver_request_total{"
    for line in data.decode(errors="replace").splitlines():
        if not line.startswith(prefix):
            continue
        labels_text, _, value = line[len(prefix) :].rpartition("} ")
        labels = dict(LABEL.findall(labels_text))
        if labels.get("verb") not in WRITE_VERBS:
            continue
        key = (
            labels.get("group", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
            labels["verb"],
            labels.get("code", ""),
        )
        counts[key] += int(float(value))
    return counts


def watching(api: Api) -> set[str]:
    """The CR plurals that have at least one WATCH open (the operator's informers)."""
    status, data = api.request("GET", "/metrics", accept="text/plain")
    found = set()
    prefix = "apiserver_longrunning_requests{"
    for line in data.decode(errors="replace").splitlines() if status == 200 else []:
        if line.startswith(prefix):
            labels_text, _, value = line[len(prefix) :].rpartition("} ")
            labels = dict(LABEL.findall(labels_text))
            if labels.get("verb") == "WATCH" and labels.get("group") == GROUP and float(value):
                found.add(labels.get("resource", ""))
    return found


def write_delta(before: WriteCounts, after: WriteCounts) -> WriteCounts:
    delta: WriteCounts = Counter()
    for key in set(before) | set(after):
        n = after.get(key, 0) - before.get(key, 0)
        if n:
            delta[key] = n
    return delta


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
        if group == GROUP and res in PLURALS:
            if sub == "status":
                cat = "cr_status"
            elif verb in ("POST", "DELETE", "DELETECOLLECTION"):
                cat = "cr_client"
            else:
                cat = "cr"
        elif group in ("", "events.k8s.io") and res == "events":
            cat = "event"
        elif group == "" and res == "secrets":
            cat = "secret"
        else:
            cat = "other"
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


# -- AWS calls, from moto's recording -----------------------------------------------------------


class Recording:
    """moto's request recording (MOTO_ENABLE_RECORDING): one JSON line per request."""

    CREDENTIAL = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/")

    def __init__(self, path: Path, access_log: Path) -> None:
        self.path = path
        self.access_log = access_log

    def mark(self) -> tuple[int, int]:
        """Where the recording and moto's access log end now."""
        return self._end(self.path), self._end(self.access_log)

    @staticmethod
    def _end(path: Path) -> int:
        """The offset just past the last complete line."""
        try:
            with path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
        except FileNotFoundError:
            return 0
        cut = tail.rfind(b"\n")
        return size - len(tail) + cut + 1 if cut >= 0 else size - len(tail)

    @staticmethod
    def _read(path: Path, start: int, end: int) -> bytes:
        if end <= start or not path.exists():
            return b""
        with path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def calls(self, start_mark: tuple[int, int], end_mark: tuple[int, int]) -> dict[str, Any]:
        """Requests between two marks: the operator's by service and action, the bench's, and
        the HTTP status codes moto answered (its access log: every client, bench included)."""
        by_action: Counter[str] = Counter()
        by_service: Counter[str] = Counter()
        codes: Counter[str] = Counter()
        bench = 0
        for line in self._read(self.access_log, start_mark[1], end_mark[1]).splitlines():
            parts = line.decode(errors="replace").rsplit(" ", 2)
            if len(parts) == 3 and parts[1].isdigit() and '"' in parts[0]:
                codes[parts[1]] += 1
        for line in self._read(self.path, start_mark[0], end_mark[0]).splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
            if BENCH_USER_AGENT in headers.get("user-agent", ""):
                bench += 1
                continue
            service, action = self.classify(entry, headers)
            by_service[service] += 1
            by_action[f"{service}:{action}"] += 1
        return {
            "operator_total": sum(by_service.values()),
            "by_service": dict(sorted(by_service.items())),
            "by_action": dict(by_action.most_common()),
            "bench_requests": bench,
            "moto_status_codes": dict(sorted(codes.items())),
        }

    def classify(self, entry: dict[str, Any], headers: dict[str, str]) -> tuple[str, str]:
        found = self.CREDENTIAL.search(headers.get("authorization", ""))
        service = found.group(1) if found else "unknown"
        target = headers.get("x-amz-target", "")
        if target:
            return service, target.rsplit(".", 1)[-1]
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            body = base64.b64decode(body).decode(errors="replace")
        if "Action=" in body:
            return service, parse_qs(body).get("Action", ["?"])[0]
        url = urlsplit(entry.get("url", ""))
        if "Action=" in url.query:
            return service, parse_qs(url.query).get("Action", ["?"])[0]
        method = entry.get("method", "?")
        if service == "s3":
            sub = url.query.split("=", 1)[0].split("&", 1)[0]
            parts = [p for p in url.path.split("/") if p]
            what = f"?{sub}" if sub else ("object" if len(parts) > 1 else "bucket")
            return service, f"{method} {what}"
        return service, method


# -- py-spy ----------------------------------------------------------------------------------


class PySpy:
    """`py-spy record --pid` attached to the operator for the create phase."""

    MODES = {"cpu": [], "gil": ["--gil"], "wall": ["--idle"]}

    def __init__(self, pid: int, output: Path, rate: int, mode: str = "cpu") -> None:
        self.pid = pid
        self.output = output
        self.rate = rate
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def executable() -> str:
        here = Path(sys.executable).parent / "py-spy"
        found = str(here) if here.exists() else shutil.which("py-spy")
        if not found:
            raise SystemExit("--py-spy needs py-spy: .venv/bin/pip install py-spy")
        return found

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.executable(),
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--output",
                str(self.output),
                "--rate",
                str(self.rate),
                "--nonblocking",
                *self.MODES[self.mode],
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.output.parent / "py-spy.log").open("ab"),
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


FRAME_LINE = re.compile(r":\d+\)$")
# (area, substrings of the whole stack): the first that matches names a sample's area.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cloud threads: boto3 TCP connect/close", ("Aws.call",)),  # refined below
    ("cloud threads: Kubernetes API calls (Secrets, status)", ("Kube.request",)),
    ("event loop: logging", ("logging/",)),
    ("event loop: kopf watch streams", ("kopf/_cogs/clients/watching",)),
    ("event loop: kopf posting Events", ("kopf/_core/engines/posting", "clients/events")),
    ("event loop: kopf patching", ("kopf/_cogs/clients/patching",)),
    ("event loop: kopf daemons", ("kopf/_core/engines/daemons",)),
    ("event loop: provisioner handlers", ("provisioner/operator.py", "provisioner/reconcile")),
    ("event loop: kopf queueing, processing, diffs", ("kopf/",)),
    ("idle executor threads", ("concurrent/futures/thread.py",)),
)
# Frames every sample of a thread passes through: left out of the inclusive ranking.
GENERIC_FRAMES = (
    "<frozen",
    "asyncio/",
    "threading.py",
    "concurrent/futures/",
    "provisioner/__main__.py",
    "provisioner/cli.py",
    "Reconciler.run.<locals>",
    "botocore/context.py",
)
CONNECTING = ("create_connection", "getaddrinfo", "_real_close", "socket.__init__", "_new_conn")
SOCKET_WAIT = ("readinto", "SSLSocket.read", "do_poll", "select")


def area_of(stack: str, leaf: str) -> str:
    for area, needles in AREAS:
        if any(n in stack for n in needles):
            if area.startswith("cloud threads: boto3"):
                if any(n in stack for n in CONNECTING):
                    return "cloud threads: boto3 TCP connect/close"
                if any(n in leaf for n in SOCKET_WAIT):
                    return "cloud threads: boto3 socket I/O"
                return "cloud threads: boto3 request building, signing, parsing"
            return area
    if "EpollSelector.select" in leaf:
        return "event loop: waiting in epoll"
    if any(n in stack for n in ("aiohttp/", "SSLObject", "asyncio/selector_events")):
        return "event loop: aiohttp and TLS I/O (kopf's API calls)"
    return "other"


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"samples": 0, "areas": [], "self": [], "inclusive": []}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        areas[area_of(stack, stack.rsplit(";", 1)[-1])] += n
        frames = [shorten(FRAME_LINE.sub(")", f)) for f in stack.split(";") if f]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] += n
        for f in set(frames):
            if not any(g in f for g in GENERIC_FRAMES):
                inclusive[f] += n

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": n, "percent": round(100 * n / total, 1)}
            for f, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "areas": rows(areas),
        "self": rows(own),
        "inclusive": rows(inclusive),
    }


def shorten(frame: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in frame:
            head, _, tail = frame.partition("(")
            return f"{head}({tail.split(marker, 1)[-1]}"
    return frame


# -- the stack -------------------------------------------------------------------------------


class Stack:
    """Control plane, moto (recording) and the operator, all children of this process."""

    def __init__(self, workdir: Path, operator_args: list[str]) -> None:
        self.workdir = workdir
        self.operator_args = operator_args
        self.cp: ControlPlane | None = None
        self.moto: MotoServer | None = None
        self.operator: OperatorProcess | None = None
        self.recording = Recording(workdir / "moto-requests.jsonl", workdir / "moto.log")

    def start(self) -> None:
        paths = ensure_binaries()
        self.cp = ControlPlane(self.workdir / "controlplane", paths)
        self.cp.start()
        self.moto = MotoServer(log=self.workdir / "moto.log", record_to=self.recording.path)
        self.moto.start()
        install_crds(self.cp.kubeconfig)
        self.operator = OperatorProcess(
            kubeconfig=str(self.cp.kubeconfig),
            endpoint_url=self.moto.url,
            log=self.workdir / "operator.log",
            extra_args=list(self.operator_args),
            extra_env={"PROVISIONER_CLUSTER_ID": "bench"},
        )
        self.operator.start()

    @property
    def operator_pid(self) -> int | None:
        return self.operator.proc.pid if self.operator and self.operator.proc else None

    def pids(self) -> dict[str, int]:
        found: dict[str, int] = {}
        if self.cp:
            found.update({name: p.pid for name, p in self.cp.procs.items()})
        if self.moto and self.moto.proc:
            found["moto"] = self.moto.proc.pid
        if self.operator_pid:
            found["operator"] = self.operator_pid
        return found

    def cpu(self) -> dict[str, float]:
        out = {name: proc_cpu_seconds(pid) for name, pid in self.pids().items()}
        snapshot = {k: v for k, v in out.items() if v is not None}
        snapshot["bench"] = self_cpu_seconds()
        return snapshot

    def stop(self) -> None:
        for part in (self.operator, self.moto, self.cp):
            if part is None:
                continue
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log(f"stopping {type(part).__name__} failed: {exc}")


# -- the objects -----------------------------------------------------------------------------


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
    # Latest LIST (start time) that showed it not yet Ready; the lower bound for Ready.
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

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": SPECS[self.kind],
        }


def plan(n: int, mix: str, namespaces: list[str], seed: int) -> list[Cr]:
    counts = split_mix(n, mix)
    plural_of = {kind: plural for _, kind, plural in KINDS}
    kinds = [kind for kind, count in counts.items() for _ in range(count)]
    random.Random(seed).shuffle(kinds)
    short = {"DatabaseInstance": "db", "S3Bucket": "bucket", "Queue": "queue"}
    return [
        Cr(kind, plural_of[kind], namespaces[i % len(namespaces)], f"{short[kind]}-{i:05d}")
        for i, kind in enumerate(kinds)
    ]


def ready_condition(item: dict[str, Any]) -> dict[str, Any] | None:
    for c in (item.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c
    return None


class Lister:
    """One LIST per kind in use, cluster-wide; no per-object GETs."""

    def __init__(self, api: Api, crs: list[Cr]) -> None:
        self.api = api
        self.by_key = {cr.key: cr for cr in crs}
        self.plurals = sorted({cr.plural for cr in crs})
        self.rounds = 0
        self.list_seconds = 0.0

    def round(self) -> list[tuple[Cr, dict[str, Any], float, float]]:
        """(cr, item, list start, list end) for every one of our CRs that exists."""
        seen = []
        for plural in self.plurals:
            start = time.time()
            items = self.api.list_items(f"/apis/{API_VERSION}/{plural}")
            end = time.time()
            self.list_seconds += end - start
            for item in items:
                meta = item["metadata"]
                cr = self.by_key.get((plural, meta["namespace"], meta["name"]))
                if cr is not None:
                    seen.append((cr, item, start, end))
        self.rounds += 1
        return seen


# -- the benchmark -----------------------------------------------------------------------------


class Failure(Exception):
    pass


@dataclass
class Options:
    n: int
    mix: str
    namespaces: int
    idle: float
    changes: int
    timeout: float
    keep: bool
    operator_args: list[str]
    json_path: Path | None
    create_method: str
    create_workers: int
    change_workers: int
    seed: int
    py_spy: Path | None
    py_spy_rate: int
    py_spy_mode: str
    workdir: Path | None


class Bench:
    def __init__(self, opts: Options, stack: Stack, api: Api) -> None:
        self.o = opts
        self.stack = stack
        self.api = api
        self.ns_names = [f"bench-{i:02d}" for i in range(opts.namespaces)]
        self.crs = plan(opts.n, opts.mix, self.ns_names, opts.seed)
        self.lister = Lister(api, self.crs)
        self.results: dict[str, Any] = {}
        self.timeouts: list[str] = []
        self.errors: list[str] = []
        self.rss_max_kib = 0
        self.spy: PySpy | None = None
        self.cpu_marks: dict[str, dict[str, float]] = {}
        assert stack.moto is not None
        config = botocore.config.Config(
            user_agent_extra=BENCH_USER_AGENT,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
        )
        session = boto3.session.Session(
            aws_access_key_id=DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=DEV_REGION,
        )
        self.aws = {
            name: session.client(name, endpoint_url=stack.moto.url, config=config)
            for name in ("s3", "sqs", "rds")
        }

    # -- sampling --------------------------------------------------------------------------

    def sample_rss(self) -> None:
        rss = proc_status_kib(self.stack.operator_pid, "VmRSS")
        if rss:
            self.rss_max_kib = max(self.rss_max_kib, rss)

    def mark_cpu(self, name: str) -> None:
        self.cpu_marks[name] = self.stack.cpu()
        # The machine may be shared: the 1-minute load average at each phase boundary.
        self.results.setdefault("loadavg_1m", {})[name] = round(os.getloadavg()[0], 2)

    def cpu_between(self, a: str, b: str) -> dict[str, float]:
        start, end = self.cpu_marks.get(a, {}), self.cpu_marks.get(b, {})
        return {k: round(end[k] - start[k], 2) for k in end if k in start}

    def settle(self, quiet: float = 3.0, cap: float = 30.0) -> tuple[WriteCounts, float, bool]:
        """Wait until the operator has made no API write for `quiet` seconds (at most `cap`)."""
        started = time.monotonic()
        last = scrape_writes(self.api)
        last_value, last_change = operator_writes(last), time.monotonic()
        while time.monotonic() - started < cap:
            time.sleep(0.5)
            self.sample_rss()
            current = scrape_writes(self.api)
            value = operator_writes(current)
            if value != last_value:
                last_value, last_change = value, time.monotonic()
            last = current
            if time.monotonic() - last_change >= quiet:
                return last, time.monotonic() - started, True
        return last, time.monotonic() - started, False

    # -- phases ----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Untimed: the operator watching every kind, moto's services loaded, namespaces."""
        started = time.monotonic()
        deadline = started + 120
        while watching(self.api) < PLURALS:
            if time.monotonic() > deadline:
                raise Failure(f"the operator is not watching {PLURALS - watching(self.api)}")
            time.sleep(0.2)
        self.results["operator_watching_after_s"] = round(time.monotonic() - started, 2)
        # moto imports a service's backend on its first request (RDS: about 1 s).
        self.aws["s3"].list_buckets()
        self.aws["sqs"].list_queues()
        self.aws["rds"].describe_db_instances()
        self.create_namespaces()

    def create_namespaces(self) -> None:
        """The namespaces, then a dry-run create of each kind in each of them (untimed).

        A fresh kube-apiserver holds the first create of a custom resource for about 2 s
        (once per process); a dry run takes that hit, stores nothing and is not seen by the
        operator, so the timed creates measure a warm API server, as in a real cluster.
        """
        started = time.monotonic()
        for ns in self.ns_names:
            self.api.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        for ns in self.ns_names:
            for kind in sorted({cr.kind for cr in self.crs}):
                cr = next(c for c in self.crs if c.kind == kind)
                body = {**cr.manifest(), "metadata": {"name": "warm-up", "namespace": ns}}
                path = f"/apis/{API_VERSION}/namespaces/{ns}/{cr.plural}?dryRun=All"
                self.api.json("POST", path, body)
        self.results["warm_up_seconds"] = round(time.monotonic() - started, 2)

    def create_via_api(self) -> None:
        def post(cr: Cr) -> None:
            path = f"/apis/{API_VERSION}/namespaces/{cr.namespace}/{cr.plural}"
            cr.sent = time.time()
            status, data = self.api.request("POST", path, cr.manifest())
            cr.returned = time.time()
            if status == 201:
                cr.created_ok = True
            else:
                self.errors.append(f"create {cr.namespace}/{cr.name}: {status} {data[:200]!r}")

        with ThreadPoolExecutor(self.o.create_workers, thread_name_prefix="create") as pool:
            list(pool.map(post, self.crs))

    def create_via_kubectl(self) -> None:
        assert self.stack.cp is not None
        kubeconfig = str(self.stack.cp.kubeconfig)
        batches: dict[str, list[Cr]] = defaultdict(list)
        for cr in self.crs:
            batches[cr.namespace].append(cr)

        def run(ns: str) -> None:
            docs = yaml.safe_dump_all([cr.manifest() for cr in batches[ns]])
            sent = time.time()
            result = subprocess.run(
                ["kubectl", f"--kubeconfig={kubeconfig}", "create", "-f", "-", "-o", "name"],
                input=docs,
                capture_output=True,
                text=True,
                check=False,
            )
            returned = time.time()
            created = set(result.stdout.split())
            for cr in batches[ns]:
                cr.sent, cr.returned = sent, returned
                cr.created_ok = f"{cr.kind.lower()}.{GROUP}/{cr.name}" in created
            if result.returncode != 0:
                self.errors.append(f"kubectl create -n {ns}: {result.stderr.strip()[:300]}")

        with ThreadPoolExecutor(len(batches), thread_name_prefix="kubectl") as pool:
            list(pool.map(run, batches))

    def phase_create(self) -> bool:
        o = self.o
        self.prepare()
        spy = None
        if o.py_spy:
            assert self.stack.operator_pid
            spy = self.spy = PySpy(self.stack.operator_pid, o.py_spy, o.py_spy_rate, o.py_spy_mode)
            spy.start()
            time.sleep(1.0)  # let it attach before the burst
        writes0 = scrape_writes(self.api)
        aws0 = self.stack.recording.mark()
        self.mark_cpu("create")
        log(f"creating {o.n} CRs in {o.namespaces} namespaces ({o.create_method})")
        started = time.time()
        for cr in self.crs:
            cr.not_ready_at = started
        create = self.create_via_api if o.create_method == "api" else self.create_via_kubectl
        done = threading.Event()
        create_end: list[float] = []

        def creator() -> None:
            try:
                create()
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                self.errors.append(f"create: {exc!r}")
            finally:
                create_end.append(time.time())
                done.set()

        thread = threading.Thread(target=creator, name="creator", daemon=True)
        thread.start()
        deadline = time.monotonic() + o.timeout
        all_ready_seen: float | None = None
        ready_count = 0
        while time.monotonic() < deadline:
            tick = time.monotonic()
            for cr, item, start, end in self.lister.round():
                self.observe(cr, item, start, end)
            self.sample_rss()
            if done.is_set():
                expected = [cr for cr in self.crs if cr.created_ok]
                ready_count = sum(1 for cr in expected if cr.ready_at is not None)
                if ready_count == len(expected):
                    all_ready_seen = time.time()
                    break
            time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.mark_cpu("ready")
        at_ready = scrape_writes(self.api)
        aws_ready = self.stack.recording.mark()
        if spy:
            spy.stop()
        settled, settle_seconds, quiet = self.settle()
        aws1 = self.stack.recording.mark()
        self.mark_cpu("settled")

        created = [cr for cr in self.crs if cr.created_ok]
        ready = [cr for cr in created if cr.ready_at is not None]
        times = [cr.time_to_ready for cr in ready if cr.time_to_ready is not None]
        per_kind: dict[str, Any] = {}
        for _, kind, _ in KINDS:
            kt = [cr.time_to_ready for cr in ready if cr.kind == kind and cr.time_to_ready]
            if kt:
                per_kind[kind] = {
                    "count": len(kt),
                    "p50_s": rounded(percentile(kt, 50)),
                    "p99_s": rounded(percentile(kt, 99)),
                }
        n = max(1, len(created))
        writes = categorize(write_delta(writes0, settled))
        aws = self.stack.recording.calls(aws0, aws1)
        kind_count = Counter(cr.kind for cr in created)
        latencies = [cr.returned - cr.sent for cr in created]
        service_kind = {"rds": "DatabaseInstance", "s3": "S3Bucket", "sqs": "Queue"}
        self.results["create"] = {
            "method": o.create_method,
            "workers": o.create_workers if o.create_method == "api" else len(self.ns_names),
            "created": len(created),
            "create_seconds": rounded(create_end[0] - started if create_end else None),
            "request_p50_s": rounded(percentile(latencies, 50)),
            "request_max_s": rounded(max(latencies) if latencies else None),
            "first_returned_s": rounded(
                min((cr.returned for cr in created), default=started) - started
            ),
        }
        self.results["ready"] = {
            "count": len(ready),
            "expected": len(created),
            "all_ready_seconds": rounded(all_ready_seen - started if all_ready_seen else None),
            "all_ready_estimated_seconds": rounded(
                max(cr.ready_at for cr in ready if cr.ready_at is not None) - started
                if ready
                else None
            ),
            "p50_s": rounded(percentile(times, 50)),
            "p90_s": rounded(percentile(times, 90)),
            "p99_s": rounded(percentile(times, 99)),
            "max_s": rounded(max(times) if times else None),
            "mean_ready_time_error_s": rounded(
                sum(cr.ready_error or 0 for cr in ready) / len(ready) if ready else None
            ),
            "per_kind": per_kind,
            "list_rounds": self.lister.rounds,
            "list_seconds_mean": rounded(self.lister.list_seconds / max(1, self.lister.rounds)),
        }
        self.results["writes_to_ready"] = {
            **writes,
            "per_cr": {
                k: round(writes[k] / n, 3)
                for k in ("operator_total", "cr", "cr_status", "secret", "event")
            },
            "at_all_ready_operator_total": operator_writes(write_delta(writes0, at_ready)),
            "settle_seconds": round(settle_seconds, 1),
            "settled": quiet,
        }
        self.results["aws_to_ready"] = {
            **aws,
            "per_cr": round(aws["operator_total"] / n, 2),
            "per_cr_by_kind": {
                service_kind[s]: round(c / kind_count[service_kind[s]], 2)
                for s, c in aws["by_service"].items()
                if kind_count.get(service_kind.get(s, ""))
            },
            "at_all_ready_operator_total": self.stack.recording.calls(aws0, aws_ready)[
                "operator_total"
            ],
        }
        self.results["per_cr"] = [
            {
                "kind": cr.kind,
                "name": f"{cr.namespace}/{cr.name}",
                "created_s": round(cr.created_at - started, 3),
                "ready_s": rounded(None if cr.ready_at is None else cr.ready_at - started),
                "time_to_ready_s": rounded(cr.time_to_ready),
            }
            for cr in created
        ]
        self.results["events_by_reason"] = self.events_by_reason()
        self.results["cpu_create_to_ready"] = self.cpu_between("create", "ready")
        if all_ready_seen is None:
            self.timeouts.append(f"ready: {ready_count}/{len(created)} Ready after {o.timeout}s")
            return False
        return True

    def observe(self, cr: Cr, item: dict[str, Any], start: float, end: float) -> None:
        meta = item["metadata"]
        cr.uid = meta.get("uid", cr.uid)
        cr.creation_ts = parse_time(meta.get("creationTimestamp"))
        cr.status = item.get("status") or {}
        cr.resource_version = meta.get("resourceVersion", "")
        cr.last_present = start
        if cr.ready_at is not None:
            return
        ready = ready_condition(item)
        if not ready or ready.get("status") != "True":
            cr.not_ready_at = start
            return
        # The LIST before showed it not Ready; this one (answered by `end`) shows it Ready.
        low, high = max(cr.not_ready_at, cr.sent), end
        transition = parse_time(ready.get("lastTransitionTime"))
        if transition is not None:
            low2, high2 = max(low, transition[0]), min(high, transition[1])
            if low2 <= high2:
                low, high = low2, high2
        cr.ready_at = (low + high) / 2
        cr.ready_error = (high - low) / 2
        cr.seen_ready = end

    def phase_idle(self) -> None:
        o = self.o
        log(f"idle for {o.idle:.0f}s")
        versions = {cr.key: cr.resource_version for cr in self.crs}
        writes0 = scrape_writes(self.api)
        aws0 = self.stack.recording.mark()
        self.mark_cpu("idle")
        started = time.monotonic()
        while time.monotonic() - started < o.idle:
            self.sample_rss()
            time.sleep(min(POLL_INTERVAL, max(0.0, o.idle - (time.monotonic() - started))))
        writes1 = scrape_writes(self.api)
        aws1 = self.stack.recording.mark()
        self.mark_cpu("idle_end")
        # CRs whose resourceVersion moved while idle (any writer, status or metadata).
        changed = sum(
            1
            for cr, item, _, _ in self.lister.round()
            if item["metadata"].get("resourceVersion") != versions.get(cr.key)
        )
        writes = categorize(write_delta(writes0, writes1))
        self.results["idle"] = {
            "seconds": o.idle,
            "writes_total": writes["operator_total"] + writes["other_total"] + writes["cr_client"],
            "writes": writes,
            "crs_changed": changed,
            "aws_calls": self.stack.recording.calls(aws0, aws1),
            "leases": self.lease_holders(),
            "cpu": self.cpu_between("idle", "idle_end"),
        }

    def events_by_reason(self) -> dict[str, int]:
        """Events in the bench namespaces by `component: type reason` (who posted what)."""
        found: Counter[str] = Counter()
        for item in self.api.list_items("/api/v1/events"):
            if item["metadata"]["namespace"] not in self.ns_names:
                continue
            component = (item.get("source") or {}).get("component") or item.get(
                "reportingComponent", "?"
            )
            found[f"{component}: {item.get('type')} {item.get('reason')}"] += int(
                item.get("count") or 1
            )
        return dict(found.most_common())

    def lease_holders(self) -> list[dict[str, str]]:
        """Who holds (and so renews) each Lease: names the component behind `leases` writes."""
        try:
            items = self.api.list_items("/apis/coordination.k8s.io/v1/leases")
        except RuntimeError:
            return []
        return [
            {
                "lease": f"{i['metadata']['namespace']}/{i['metadata']['name']}",
                "holder": (i.get("spec") or {}).get("holderIdentity", ""),
                "renewTime": (i.get("spec") or {}).get("renewTime", ""),
                "manager": ",".join(
                    sorted({m.get("manager", "") for m in i["metadata"].get("managedFields", [])})
                ),
            }
            for i in items
        ]

    # spec changes: (patch, check against moto) per kind
    def change_for(self, cr: Cr, i: int) -> tuple[dict[str, Any], Callable[[], bool], str]:
        name = cr.status.get("externalName", "")
        if cr.kind == "Queue":
            value = 31 + i % 600
            url = (
                cr.status.get("queueUrl")
                or self.aws["sqs"].get_queue_url(QueueName=name)["QueueUrl"]
            )

            def visibility_applied() -> bool:
                attrs = self.aws["sqs"].get_queue_attributes(
                    QueueUrl=url, AttributeNames=["VisibilityTimeout"]
                )["Attributes"]
                return attrs.get("VisibilityTimeout") == str(value)

            return (
                {"spec": {"visibilityTimeoutSeconds": value}},
                visibility_applied,
                "visibilityTimeoutSeconds",
            )
        if cr.kind == "S3Bucket":

            def versioning_applied() -> bool:
                answer = self.aws["s3"].get_bucket_versioning(Bucket=name)
                return answer.get("Status") == "Enabled"

            return {"spec": {"versioning": True}}, versioning_applied, "versioning"
        value = 8 + i % 28

        def retention_applied() -> bool:
            inst = self.aws["rds"].describe_db_instances(DBInstanceIdentifier=name)
            found = inst["DBInstances"][0]
            pending = found.get("PendingModifiedValues") or {}
            applied = (found.get("BackupRetentionPeriod"), pending.get("BackupRetentionPeriod"))
            return value in applied

        return {"spec": {"backupRetentionDays": value}}, retention_applied, "backupRetentionDays"

    def phase_changes(self) -> bool:
        o = self.o
        candidates = [cr for cr in self.crs if cr.ready_at is not None and cr.status]
        chosen = random.Random(o.seed + 1).sample(candidates, min(o.changes, len(candidates)))
        log(f"changing {len(chosen)} CRs ({o.change_workers} at a time)")
        writes0 = scrape_writes(self.api)
        aws0 = self.stack.recording.mark()
        self.mark_cpu("changes")
        deadline = time.monotonic() + o.timeout
        latencies: list[tuple[str, float]] = []
        failures: list[str] = []
        patches: list[str] = []
        lock = threading.Lock()

        def change(args: tuple[int, Cr]) -> None:
            i, cr = args
            try:
                patch, check, what = self.change_for(cr, i)
                path = f"/apis/{API_VERSION}/namespaces/{cr.namespace}/{cr.plural}/{cr.name}"
                status, data = self.api.request(
                    "PATCH", path, patch, content_type="application/merge-patch+json"
                )
                with lock:
                    patches.append(cr.name)
                if status != 200:
                    raise Failure(f"PATCH {status} {data[:200]!r}")
                returned = time.monotonic()
                previous = returned
                while time.monotonic() < deadline:
                    asked = time.monotonic()
                    if check():
                        # The cloud changed after the check before this one was sent and
                        # before this one was answered.
                        seen = (previous + time.monotonic()) / 2
                        with lock:
                            latencies.append((cr.kind, seen - returned))
                        return
                    previous = asked
                    time.sleep(0.05)
                raise Failure(f"{what} not reflected in the cloud after {o.timeout}s")
            except Exception as exc:  # noqa: BLE001 - counted and reported
                with lock:
                    failures.append(f"{cr.kind} {cr.namespace}/{cr.name}: {exc}")

        with ThreadPoolExecutor(o.change_workers, thread_name_prefix="change") as pool:
            list(pool.map(change, enumerate(chosen)))
        settled, _, _ = self.settle(cap=15.0)
        aws1 = self.stack.recording.mark()
        self.mark_cpu("changes_end")
        values = [v for _, v in latencies]
        writes = categorize(write_delta(writes0, settled), client_patches=len(patches))
        self.results["changes"] = {
            "requested": len(chosen),
            "reflected": len(values),
            "workers": o.change_workers,
            "p50_s": rounded(percentile(values, 50)),
            "p99_s": rounded(percentile(values, 99)),
            "max_s": rounded(max(values) if values else None),
            "per_kind_p50_s": {
                kind: rounded(percentile([v for k, v in latencies if k == kind], 50))
                for _, kind, _ in KINDS
                if any(k == kind for k, _ in latencies)
            },
            "failures": failures[:20],
            "writes": writes,
            "aws_calls": self.stack.recording.calls(aws0, aws1),
            "cpu": self.cpu_between("changes", "changes_end"),
        }
        if failures:
            self.timeouts.append(f"changes: {len(failures)} not reflected: {failures[0]}")
            return False
        return True

    def phase_delete(self) -> bool:
        o = self.o
        present = [cr for cr in self.crs if cr.created_ok]
        log(f"deleting {len(present)} CRs")
        writes0 = scrape_writes(self.api)
        aws0 = self.stack.recording.mark()
        self.mark_cpu("delete")
        started = time.time()
        for cr in present:
            cr.last_present = started
        targets = sorted({(cr.namespace, cr.plural) for cr in present})

        def delete(target: tuple[str, str]) -> None:
            ns, plural = target
            path = f"/apis/{API_VERSION}/namespaces/{ns}/{plural}"
            status, data = self.api.request("DELETE", path)
            if status >= 300:
                self.errors.append(f"delete {ns}/{plural}: {status} {data[:200]!r}")

        with ThreadPoolExecutor(16, thread_name_prefix="delete") as pool:
            list(pool.map(delete, targets))
        deadline = time.monotonic() + o.timeout
        all_gone: float | None = None
        remaining = len(present)
        while time.monotonic() < deadline:
            tick = time.monotonic()
            seen = self.lister.round()
            here = {cr.key for cr, *_ in seen}
            for cr, _item, start, _ in seen:
                cr.last_present = start
            for cr in present:
                if cr.gone_at is None and cr.key not in here:
                    cr.gone_at = (cr.last_present + time.time()) / 2
            self.sample_rss()
            remaining = len(here)
            if not here:
                all_gone = time.time()
                break
            time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))
        self.mark_cpu("deleted")
        writes1 = scrape_writes(self.api)
        aws1 = self.stack.recording.mark()
        left = self.cloud_left()
        secrets_left = self.secrets_left()
        gone_times = [cr.gone_at - started for cr in present if cr.gone_at is not None]
        writes = categorize(write_delta(writes0, writes1))
        n = max(1, len(present))
        aws = self.stack.recording.calls(aws0, aws1)
        self.results["delete"] = {
            "all_gone_seconds": rounded(all_gone - started if all_gone else None),
            "remaining": remaining,
            "p50_s": rounded(percentile(gone_times, 50)),
            "p99_s": rounded(percentile(gone_times, 99)),
            "writes": writes,
            "writes_per_cr": round(writes["operator_total"] / n, 3),
            "aws_calls": aws,
            "aws_per_cr": round(aws["operator_total"] / n, 2),
            "cpu": self.cpu_between("delete", "deleted"),
        }
        self.results["cloud_resources_left"] = left
        self.results["secrets_left"] = secrets_left
        if all_gone is None:
            self.timeouts.append(f"delete: {remaining} CRs still there after {o.timeout}s")
            return False
        return True

    def cloud_left(self) -> dict[str, int]:
        s3, sqs, rds = self.aws["s3"], self.aws["sqs"], self.aws["rds"]
        buckets = len(s3.list_buckets().get("Buckets") or [])
        queues = 0
        for page in sqs.get_paginator("list_queues").paginate(PaginationConfig={"PageSize": 1000}):
            queues += len(page.get("QueueUrls") or [])
        instances = snapshots = 0
        for page in rds.get_paginator("describe_db_instances").paginate():
            instances += len(page.get("DBInstances") or [])
        for page in rds.get_paginator("describe_db_snapshots").paginate():
            snapshots += len(page.get("DBSnapshots") or [])
        return {
            "total": buckets + queues + instances,
            "buckets": buckets,
            "queues": queues,
            "db_instances": instances,
            # Final snapshots of deletionPolicy Snapshot (the DatabaseInstance default) are
            # kept by design; not counted as leaks.
            "db_snapshots_by_policy": snapshots,
        }

    def secrets_left(self) -> int:
        count = 0
        for item in self.api.list_items("/api/v1/secrets"):
            meta = item["metadata"]
            if meta["namespace"] in self.ns_names and HASH_ANNOTATION in (
                meta.get("annotations") or {}
            ):
                count += 1
        return count

    def finish(self) -> None:
        pid = self.stack.operator_pid
        self.sample_rss()
        hwm = proc_status_kib(pid, "VmHWM")
        self.mark_cpu("end")
        self.results["operator"] = {
            "pid": pid,
            "peak_rss_mb": rounded((hwm or self.rss_max_kib) / 1024, 1),
            "vmhwm_kib": hwm,
            "sampled_max_rss_kib": self.rss_max_kib,
            "cpu_seconds": rounded(self.cpu_marks["end"].get("operator"), 2),
        }
        self.results["cpu_seconds_total"] = {
            k: round(v, 2) for k, v in self.cpu_marks["end"].items()
        }

    def run(self) -> None:
        o = self.o
        ok = self.phase_create()
        if ok and not self.errors:
            self.phase_idle()
            if o.changes > 0:
                self.phase_changes()
        else:
            log("not every CR became Ready: skipping the idle and change phases")
        self.phase_delete()
        self.finish()


# -- report ----------------------------------------------------------------------------------


def fmt_s(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} s"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISSED")


def build_report(opts: Options, counts: dict[str, int], results: dict[str, Any]) -> dict[str, Any]:
    create = results.get("create", {})
    ready = results.get("ready", {})
    writes = results.get("writes_to_ready", {})
    per_cr = writes.get("per_cr", {})
    idle = results.get("idle", {})
    changes = results.get("changes", {})
    delete = results.get("delete", {})
    left = results.get("cloud_resources_left", {})
    op = results.get("operator", {})
    aws = results.get("aws_to_ready", {})
    return {
        "n": opts.n,
        "mix": opts.mix,
        "kinds": counts,
        "namespaces": opts.namespaces,
        "create_seconds": create.get("create_seconds"),
        "all_ready_seconds": ready.get("all_ready_seconds"),
        "ready_p50_s": ready.get("p50_s"),
        "ready_p99_s": ready.get("p99_s"),
        "all_deleted_seconds": delete.get("all_gone_seconds"),
        "cloud_resources_left": left.get("total"),
        "operator_peak_rss_mb": op.get("peak_rss_mb"),
        "operator_cpu_seconds": op.get("cpu_seconds"),
        "api_writes_per_cr_to_ready": per_cr.get("operator_total"),
        "api_writes_per_cr_to_ready_split": {
            "cr": per_cr.get("cr"),
            "cr_status": per_cr.get("cr_status"),
            "secret": per_cr.get("secret"),
            "event": per_cr.get("event"),
        },
        "idle_writes": idle.get("writes_total"),
        "idle_operator_writes": (idle.get("writes") or {}).get("operator_total"),
        "change_p50_s": changes.get("p50_s"),
        "change_p99_s": changes.get("p99_s"),
        "aws_calls_per_cr_to_ready": aws.get("per_cr"),
    }


def table(
    opts: Options, summary: dict[str, Any], results: dict[str, Any], source: dict[str, Any]
) -> str:
    ready = results.get("ready", {})
    create = results.get("create", {})
    writes = results.get("writes_to_ready", {})
    per_cr = writes.get("per_cr", {})
    idle = results.get("idle", {})
    idle_writes = idle.get("writes") or {}
    changes = results.get("changes", {})
    delete = results.get("delete", {})
    left = results.get("cloud_resources_left", {})
    op = results.get("operator", {})
    aws = results.get("aws_to_ready", {})
    cpu_ready = results.get("cpu_create_to_ready", {})
    kinds = summary["kinds"]
    load = results.get("loadavg_1m", {})

    def lt(value: float | None, limit: float) -> bool | None:
        return None if value is None else value < limit

    def le(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    non_event = None
    if per_cr:
        non_event = round(per_cr["cr"] + per_cr["cr_status"] + per_cr["secret"], 3)
    by_kind = aws.get("per_cr_by_kind") or {}
    idle_other = ", ".join(f"{k} {v}" for k, v in (idle_writes.get("other") or {}).items())
    rows: list[tuple[str, str, str, str]] = [
        ("N", str(opts.n), "", ""),
        (
            "mix db:s3:sqs",
            f"{opts.mix} ({kinds['DatabaseInstance']}/{kinds['S3Bucket']}/{kinds['Queue']})",
            "",
            "",
        ),
        ("namespaces", str(opts.namespaces), "", ""),
        ("operator source (sha256 of provisioner/, crds/)", source["sha256"], "", ""),
        ("operator args", " ".join(opts.operator_args) or "(defaults)", "", ""),
        (
            "machine: CPUs, load avg 1m (start/Ready)",
            f"{os.cpu_count()}, {load.get('create', '?')} / {load.get('ready', '?')}",
            "",
            "",
        ),
        (
            f"create time ({create.get('method', '?')}, {create.get('workers', '?')} at once)",
            fmt_s(create.get("create_seconds")),
            "",
            "",
        ),
        (
            "time to all Ready (from first create)",
            fmt_s(ready.get("all_ready_seconds")),
            "< 60 s",
            verdict(lt(ready.get("all_ready_seconds"), 60)),
        ),
        (
            "per-CR time to Ready p50 / p99",
            f"{fmt_s(ready.get('p50_s'))} / {fmt_s(ready.get('p99_s'))}",
            "",
            "",
        ),
        (
            "time to all deleted",
            fmt_s(delete.get("all_gone_seconds")),
            "< 60 s",
            verdict(lt(delete.get("all_gone_seconds"), 60)),
        ),
        (
            "cloud resources left (buckets/queues/dbs)",
            "n/a"
            if not left
            else f"{left['total']} ({left['buckets']}/{left['queues']}/{left['db_instances']})",
            "0",
            verdict(None if not left else left["total"] == 0),
        ),
        (
            "operator peak RSS (VmHWM)",
            "n/a" if op.get("peak_rss_mb") is None else f"{op['peak_rss_mb']:.1f} MB",
            "< 150 MB",
            verdict(lt(op.get("peak_rss_mb"), 150)),
        ),
        (
            "operator CPU seconds (total / to Ready)",
            f"{fmt_s(op.get('cpu_seconds'), 1)} / {fmt_s(cpu_ready.get('operator'), 1)}",
            "",
            "",
        ),
        (
            "API writes per CR to Ready (operator)",
            "n/a" if not per_cr else f"{per_cr['operator_total']:.2f}",
            "<= 4 + 2 Events",
            "",
        ),
        (
            "  CR (finalizer, metadata)",
            "n/a" if not per_cr else f"{per_cr['cr']:.2f}",
            "",
            "",
        ),
        ("  CR status", "n/a" if not per_cr else f"{per_cr['cr_status']:.2f}", "", ""),
        ("  Secret", "n/a" if not per_cr else f"{per_cr['secret']:.2f}", "", ""),
        (
            "  = without Events",
            "n/a" if non_event is None else f"{non_event:.2f}",
            "<= 4",
            verdict(le(non_event, 4)),
        ),
        (
            "  Event",
            "n/a" if not per_cr else f"{per_cr['event']:.2f}",
            "<= 2",
            verdict(le(per_cr.get("event"), 2)),
        ),
        (
            f"writes during idle ({opts.idle:.0f} s): operator",
            "n/a" if not idle else str(idle_writes.get("operator_total", 0)),
            "0",
            verdict(None if not idle else idle_writes.get("operator_total") == 0),
        ),
        (
            "  others (resource verb count)",
            "n/a" if not idle else (idle_other or "0"),
            "",
            "",
        ),
        (
            f"spec-change latency p50 / p99 ({changes.get('reflected', 0)} changes)",
            "n/a"
            if not changes
            else f"{fmt_s(changes.get('p50_s'))} / {fmt_s(changes.get('p99_s'))}",
            "p99 < 2 s",
            verdict(lt(changes.get("p99_s"), 2)),
        ),
        (
            "AWS calls per CR to Ready (moto recorder)",
            "n/a"
            if not aws
            else f"{aws['per_cr']:.2f} ("
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_kind.items(), key=lambda kv: kv[0]))
            + ")",
            "",
            "",
        ),
    ]
    headers = ("figure", "value", "target", "")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths[:3]))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def profile_text(profile: dict[str, Any], top: int = 15) -> str:
    lines = [
        f"py-spy profile of the operator ({profile.get('mode', 'cpu')} mode), create -> all Ready"
        f" ({profile['samples']} samples)"
    ]
    for title, key in (("area", "areas"), ("self", "self"), ("inclusive", "inclusive")):
        lines.append(f"  top by {title}:")
        for row in profile[key][:top]:
            lines.append(f"    {row['percent']:5.1f}%  {row['function']}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(
        prog="bench/converge.py",
        description="Convergence benchmark of the provisioner operator (see bench/README.md).",
    )
    p.add_argument("--n", type=int, default=1000, help="number of CRs (default 1000)")
    p.add_argument("--mix", default="1:1:1", help="db:s3:sqs weights (default 1:1:1)")
    p.add_argument("--namespaces", type=int, default=10, help="spread over this many (10)")
    p.add_argument("--idle", type=float, default=60, help="idle phase seconds (default 60)")
    p.add_argument("--changes", type=int, default=100, help="spec changes to time (100)")
    p.add_argument("--timeout", type=float, default=600, help="per phase, seconds (600)")
    p.add_argument("--keep", action="store_true", help="leave everything running at the end")
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="ARG",
        help="passed to `provisioner run` (repeatable; use --operator-arg=--workers=64)",
    )
    p.add_argument("--json", type=Path, dest="json_path", metavar="PATH", help="write figures")
    p.add_argument(
        "--create-method",
        choices=["api", "kubectl"],
        default="api",
        help="api: POSTs from a thread pool (default); kubectl: `kubectl create -f -` per "
        "namespace, all namespaces in parallel",
    )
    p.add_argument("--create-workers", type=int, default=16, help="threads for api (16)")
    p.add_argument("--change-workers", type=int, default=4, help="changes in flight (4)")
    p.add_argument("--seed", type=int, default=1, help="for the kind order and the changes")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="PATH",
        help="attach `py-spy record --format raw` to the operator from the first create "
        "until all are Ready, write the samples to PATH and summarise the top functions",
    )
    p.add_argument("--py-spy-rate", type=int, default=100, help="samples per second (100)")
    p.add_argument(
        "--py-spy-mode",
        choices=sorted(PySpy.MODES),
        default="cpu",
        help="cpu: threads py-spy sees as active (default); gil: only the thread holding the "
        "GIL (Python CPU time); wall: every thread, waiting ones too",
    )
    p.add_argument("--workdir", type=Path, help="logs and data here (default: a temp dir)")
    a = p.parse_args(argv)
    if a.n < 1 or a.namespaces < 1:
        p.error("--n and --namespaces must be >= 1")
    return Options(
        n=a.n,
        mix=a.mix,
        namespaces=a.namespaces,
        idle=a.idle,
        changes=a.changes,
        timeout=a.timeout,
        keep=a.keep,
        operator_args=a.operator_args,
        json_path=a.json_path,
        create_method=a.create_method,
        create_workers=a.create_workers,
        change_workers=a.change_workers,
        seed=a.seed,
        py_spy=a.py_spy.resolve() if a.py_spy else None,
        py_spy_rate=a.py_spy_rate,
        py_spy_mode=a.py_spy_mode,
        workdir=a.workdir,
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    counts = split_mix(opts.n, opts.mix)

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C even where SIGINT was ignored at start (e.g. a background job of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if opts.workdir:
        workdir = opts.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="provisioner-bench-"))
    stack = Stack(workdir, opts.operator_args)
    bench: Bench | None = None
    code = 1
    keep_dir = opts.keep or opts.workdir is not None
    load = os.getloadavg()
    try:
        source = source_fingerprint()
        log(f"starting the control plane, moto and the operator in {workdir}")
        newest = f"{source['newest']} {source['newest_mtime']}"
        log(f"operator source {source['sha256']} (newest file: {newest})")
        started = time.monotonic()
        stack.start()
        setup_seconds = time.monotonic() - started
        log(f"up in {setup_seconds:.1f}s; pids {stack.pids()}")
        assert stack.cp is not None
        api = Api(stack.cp.kubeconfig, pool_size=max(32, opts.create_workers))
        bench = Bench(opts, stack, api)
        bench.run()
        results = bench.results
        summary = build_report(opts, counts, results)
        failed = bool(bench.timeouts or bench.errors)
        leaked = (results.get("cloud_resources_left") or {}).get("total", 1) != 0
        code = 1 if failed or leaked else 0
        profile = summarize_profile(opts.py_spy) if opts.py_spy else None
        if profile is not None:
            profile["mode"] = opts.py_spy_mode
        document = {
            **summary,
            "ok": code == 0,
            "timeouts": bench.timeouts,
            "errors": bench.errors[:50],
            "machine": {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load]},
            "setup_seconds": round(setup_seconds, 1),
            "operator_args": opts.operator_args,
            "operator_source": source,
            "aws_calls_counted_with": "moto recorder (MOTO_ENABLE_RECORDING)",
            "details": results,
            "profile": profile,
            "workdir": str(workdir) if keep_dir or code else None,
        }
        print(table(opts, summary, results, source))
        if profile:
            print()
            print(profile_text(profile))
        for problem in bench.timeouts + bench.errors[:10]:
            print(f"FAILED: {problem}")
        if leaked and "cloud_resources_left" in results:
            print(f"FAILED: cloud resources left: {results['cloud_resources_left']}")
        if opts.json_path:
            opts.json_path.write_text(json.dumps(document, indent=2) + "\n")
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        code = 130
    except Exception:  # noqa: BLE001 - reported; the stack is stopped below
        traceback.print_exc()
        code = 1
    finally:
        if bench is not None and bench.spy is not None:
            bench.spy.stop()
        if opts.keep and stack.cp is not None and stack.moto is not None:
            pids = stack.pids()
            env = workdir / "env"
            env.write_text(
                f"export KUBECONFIG={stack.cp.kubeconfig}\n"
                f"export AWS_ENDPOINT_URL={stack.moto.url}\n"
                f"export AWS_REGION={DEV_REGION} AWS_DEFAULT_REGION={DEV_REGION}\n"
                + "".join(f"export {k}={v}\n" for k, v in DEV_CREDENTIALS.items())
            )
            log(f"--keep: left running: {pids}; `source {env}`")
            ids = ", ".join(str(pid) for pid in reversed(pids.values()))
            log(
                "stop with: .venv/bin/python -c 'from provisioner_dev.processes import stop; "
                f"[stop(p) for p in ({ids})]'"
            )
        else:
            stack.stop()
            if code == 0 and not keep_dir:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                log(f"logs and data kept in {workdir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
