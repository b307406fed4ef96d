#!/usr/bin/env python3
"""Side by side: AWS Controllers for Kubernetes' s3-controller and this operator, N buckets each.

One control plane and one moto (its request recorder on) for both, one controller at a time:

1. ACK: its CRDs applied, its controller started as a child process against the same
   kubeconfig and moto (--watch-namespace=ack-bench), N `Bucket` CRs (s3.services.k8s.aws,
   spec.name unique) created as fast as the API takes them, until every one is
   `ACK.ResourceSynced=True`; all deleted, until gone; the controller stopped.
2. This operator (`provisioner run`, its defaults): N `S3Bucket` CRs with `spec: {}` in
   provisioner-bench, until every one is `Ready=True`; all deleted; the operator stopped.

For each: the time to all Ready/Synced, AWS calls per bucket to Ready (moto's recording, from
the first create until the controller made no call for 3 s; grouped by the bucket each names),
the controller's RSS before the first CR, sampled every 0.2 s (VmRSS) and its VmHWM at the
end (/proc/<pid>/status), CPU seconds, API writes, time to all deleted and the buckets left in
moto. A table, and --json PATH. Everything started is stopped at the end, on failure, on
Ctrl-C and on SIGTERM.

    .venv/bin/python bench/ack.py --n 500
    .venv/bin/python bench/ack.py --n 500 --json /tmp/ack.json

ACK's controller is a Go binary built once per machine and cached in
~/.cache/provisioner/ack-s3-controller-<version>/ (with its CRDs), like the control plane's
binaries (provisioner_dev/binaries.py): through the Go module proxy, or `--ack-binary PATH
--ack-crds DIR` to put one built elsewhere into that cache. See bench/README.md, "Side by side
with ACK's s3-controller".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lib import log, stop_on_signals  # noqa: E402
from bench.lib.measure import (  # noqa: E402
    WriteCounts,
    percentile,
    proc_cpu_seconds,
    proc_status_kib,
    rounded,
    scrape_writes,
    source_fingerprint,
    write_delta,
)
from bench.lib.recording import BENCH_USER_AGENT, Recording  # noqa: E402
from provisioner_dev import binaries  # noqa: E402
from provisioner_dev.cloud import DevCloud  # noqa: E402
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402
from provisioner_dev.processes import LoopbackService, free_port  # noqa: E402
from provisioner_dev.stack import DEV_CREDENTIALS, DEV_REGION, _http_up, install_crds  # noqa: E402

ACK_MODULE = "github.com/aws-controllers-k8s/s3-controller"
ACK_VERSION = "v1.10.0"
ACK_GROUP = "s3.services.k8s.aws"
ACK_NAMESPACE = "ack-bench"
OURS_GROUP = "cloud.provisioner.dev"
OURS_NAMESPACE = "provisioner-bench"
# Targets of this comparison (bench/README.md).
CALLS_PER_BUCKET_TARGET = 6.0
RSS_RATIO_TARGET = 1.2
RSS_INTERVAL = 0.2
POLL_INTERVAL = 0.5
# A DELETE collection the API server did not finish is asked again after this many seconds.
DELETE_RETRY = 5.0


# -- ACK's controller: the cached binary and its CRDs ----------------------------------------------


def ack_component(version: str, module_dir: Path | None = None) -> binaries.Component:
    """ACK's s3-controller as a cached component (`controller`, beside it `crds/`)."""
    return binaries.Component(
        name="ack-s3-controller",
        version=version,
        module_dir=module_dir or Path(),
        packages={"controller": "./cmd/controller"},
        ldflags=f"-s -w -X {ACK_MODULE}/pkg/version.GitVersion={version}",
    )


def crd_files(module_dir: Path) -> list[Path]:
    """ACK's CRDs in a module: the service's (config/crd/bases) and the common ones."""
    found = sorted((module_dir / "config" / "crd" / "bases").glob("*.yaml"))
    found += sorted((module_dir / "config" / "crd" / "common" / "bases").glob("*.yaml"))
    return found


def cached_ack(version: str) -> tuple[Path, Path] | None:
    """(controller binary, CRD directory) from the cache, if both are there and intact."""
    component = ack_component(version)
    found = binaries.cached_binaries(component)
    crds = component.cache_dir / "crds"
    if found is None or not any(crds.glob("*.yaml")):
        return None
    return found["controller"], crds


def _copy_crds(files: list[Path], cache_dir: Path) -> None:
    if not files:
        raise binaries.BuildError("no CRDs found (config/crd/bases, config/crd/common/bases)")
    target = cache_dir / "crds"
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, target / f.name)


def adopt_ack(version: str, binary: Path, crd_dir: Path) -> tuple[Path, Path]:
    """Put a controller built elsewhere (and its CRDs: a module's root or a directory of
    YAML files) into the cache, with a manifest as provisioner_dev/binaries.py writes."""
    component = ack_component(version)
    probe = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False)
    if "--aws-endpoint-url" not in probe.stdout + probe.stderr:
        raise binaries.BuildError(f"{binary} --help does not look like an ACK controller")
    files = crd_files(crd_dir) or sorted(crd_dir.glob("*.yaml"))
    staging = component.cache_dir.with_name(component.cache_dir.name + f".adopting-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy2(binary, staging / "controller")
    _copy_crds(files, staging)
    _write_manifest(staging, version)
    shutil.rmtree(component.cache_dir, ignore_errors=True)
    staging.rename(component.cache_dir)
    found = cached_ack(version)
    if found is None:
        raise binaries.BuildError(f"the cache in {component.cache_dir} does not verify")
    return found


def _write_manifest(directory: Path, version: str) -> None:
    path = directory / "controller"
    manifest = {
        "version": version,
        "binaries": {
            "controller": {
                "size": path.stat().st_size,
                "mtime": int(path.stat().st_mtime),
                "sha256": binaries._sha256(path),
            }
        },
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))


def download_module(version: str) -> Path:
    """ACK's module through the Go module proxy (`go mod download -json`): its directory in
    the module cache; BuildError with the proxy's own answer when it is refused."""
    go = binaries.go_binary()
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{ACK_MODULE}@{version}"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"Error": (done.stderr or done.stdout).strip()}
    if answer.get("Error") or not answer.get("Dir"):
        raise binaries.BuildError(
            f"the Go module proxy ({os.environ.get('GOPROXY') or 'GOPROXY default'}) did not "
            f"serve {ACK_MODULE}@{version}: {answer.get('Error', 'no directory')!s}; build the "
            "controller elsewhere and pass --ack-binary PATH --ack-crds DIR"
        )
    return Path(answer["Dir"])


def ensure_ack(version: str) -> tuple[Path, Path]:
    """The cached controller and CRDs, built once through the Go module proxy if missing."""
    found = cached_ack(version)
    if found is not None:
        return found
    module_dir = download_module(version)
    component = ack_component(version, module_dir)
    binaries.build(component)  # caches the binary (manifest.json) or raises BuildError
    _copy_crds(crd_files(module_dir), component.cache_dir)
    found = cached_ack(version)
    if found is None:
        raise binaries.BuildError(f"the cache in {component.cache_dir} does not verify")
    return found


@dataclass(kw_only=True)
class AckController(LoopbackService):
    """ACK's controller as a child process; `port` is its health probe's."""

    binary: Path
    kubeconfig: str
    endpoint_url: str
    namespace: str
    extra_args: list[str] = field(default_factory=list)

    def args(self, metrics_port: int) -> list[str]:
        return [
            str(self.binary),
            f"--aws-region={DEV_REGION}",
            f"--aws-endpoint-url={self.endpoint_url}",
            # STS too (GetCallerIdentity at start): nothing may leave the machine.
            f"--aws-identity-endpoint-url={self.endpoint_url}",
            "--allow-unsafe-aws-endpoint-urls",
            "--aws-endpoint-use-path-style",
            "--enable-development-logging=false",
            "--log-level=info",
            f"--watch-namespace={self.namespace}",
            "--enable-leader-election=false",
            f"--healthz-addr=127.0.0.1:{self.port}",
            f"--metrics-addr=127.0.0.1:{metrics_port}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        env = dict(
            os.environ,
            KUBECONFIG=self.kubeconfig,
            AWS_REGION=DEV_REGION,
            AWS_DEFAULT_REGION=DEV_REGION,
            # Any client the flags miss goes to moto too; no instance metadata lookups.
            AWS_ENDPOINT_URL=self.endpoint_url,
            AWS_EC2_METADATA_DISABLED="true",
            **DEV_CREDENTIALS,
        )
        # ACK's runtime wraps the SDK's HTTP client, so the SDK cannot add a CA bundle to it:
        # with AWS_CA_BUNDLE set every reconcile fails ("unable to add custom RootCAs
        # HTTPClient"). moto is plain HTTP: no bundle needed.
        env.pop("AWS_CA_BUNDLE", None)
        self.launch(
            self.args(free_port()),
            lambda: _http_up(f"{self.url}/healthz"),
            what="ACK s3-controller",
            timeout=timeout,
            env=env,
        )


# -- moto as AWS answers one read ACK depends on ---------------------------------------------------

# AWS has encrypted every new bucket with SSE-S3 since January 2023, so GetBucketEncryption
# always finds a configuration; moto answers ServerSideEncryptionConfigurationNotFoundError for
# a bucket nobody configured, and ACK's read (hook.go, addPutFieldsToSpec) then dereferences
# the missing answer and panics on every reconcile. moto's server process alone loads this
# (PYTHONPATH), so that it answers AWS's default; nothing else changes.
MOTO_SITECUSTOMIZE = """\
import importlib.abc
import importlib.util
import sys

AWS_DEFAULT = {
    "Rule": {
        "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
        "BucketKeyEnabled": False,
    }
}


def _patch(models):
    original = models.S3Backend.get_bucket_encryption

    def get_bucket_encryption(self, bucket_name):
        return original(self, bucket_name) or AWS_DEFAULT

    models.S3Backend.get_bucket_encryption = get_bucket_encryption


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "moto.s3.models":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
"""


def moto_with_aws_defaults(stack: Stack) -> None:
    """Start the stack's moto with MOTO_SITECUSTOMIZE on its PYTHONPATH (and only moto's)."""
    where = stack.dir / "moto-aws-defaults"
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(MOTO_SITECUSTOMIZE)
    start = stack.cloud.start

    def start_moto(timeout: float = 60.0) -> None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), saved) if p)
        try:
            start(timeout=timeout)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved

    stack.cloud.start = start_moto  # type: ignore[method-assign]


# -- what is measured: pure parts ------------------------------------------------------------------


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


# -- one controller's run --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One controller under test: its CRs and what Ready means for them."""

    key: str  # "ack" or "ours"
    label: str
    group: str
    version: str
    kind: str
    plural: str
    namespace: str
    condition: str  # the condition that must be True
    spec: Callable[[int], dict[str, Any]]
    prefix: str  # of the CRs' names

    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/namespaces/{self.namespace}/{self.plural}"

    def manifest(self, i: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": self.kind,
            "metadata": {"name": f"{self.prefix}-{i:05d}", "namespace": self.namespace},
            "spec": self.spec(i),
        }

    def ready(self, item: dict[str, Any]) -> bool:
        for c in (item.get("status") or {}).get("conditions") or []:
            if c.get("type") == self.condition:
                return c.get("status") == "True"
        return False


def ack_side(run_id: str) -> Side:
    return Side(
        key="ack",
        label=f"ACK s3-controller {ACK_VERSION}",
        group=ACK_GROUP,
        version="v1alpha1",
        kind="Bucket",
        plural="buckets",
        namespace=ACK_NAMESPACE,
        condition="ACK.ResourceSynced",
        spec=lambda i: {"name": f"ack-bench-{run_id}-{i:05d}"},
        prefix="ack",
    )


def ours_side() -> Side:
    return Side(
        key="ours",
        label="provisioner",
        group=OURS_GROUP,
        version="v1beta1",
        kind="S3Bucket",
        plural="s3buckets",
        namespace=OURS_NAMESPACE,
        condition="Ready",
        spec=lambda i: {},
        prefix="bucket",
    )


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


class Run:
    """One side against the stack: prepare, create until all Ready, settle, delete."""

    def __init__(self, side: Side, n: int, stack: Stack, api: KubeJson, opts: Any) -> None:
        self.side = side
        self.n = n
        self.stack = stack
        self.api = api
        self.o = opts
        assert stack.recording is not None
        self.recording = Recording(stack.recording, stack.cloud.log)
        self.cloud = DevCloud(stack.cloud.url, user_agent=BENCH_USER_AGENT)
        self.endpoint_host = urlsplit(stack.cloud.url).hostname or ""
        self.result: dict[str, Any] = {"controller": side.label, "n": n}
        self.errors: list[str] = []
        self.rss: RssSampler | None = None
        self.pid: int | None = None

    def watching(self) -> bool:
        """The controller has a WATCH open on its CRs (the API server's own gauge)."""
        try:
            text = self.api.text("/metrics")
        except RuntimeError:
            return False
        wanted = ('verb="WATCH"', f'group="{self.side.group}"', f'resource="{self.side.plural}"')
        return any(
            line.startswith("apiserver_longrunning_requests{")
            and all(w in line for w in wanted)
            and float(line.rsplit(" ", 1)[1]) > 0
            for line in text.splitlines()
        )

    def prepare(self, pid: int) -> None:
        """Untimed: the controller watching, moto's S3 loaded, the namespace, one dry run."""
        self.pid = pid
        self.rss = RssSampler(pid).start()
        deadline = time.monotonic() + 120
        while not self.watching():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.side.label} is not watching {self.side.plural}")
            time.sleep(0.2)
        self.cloud.client("s3").list_buckets()
        ns = {"metadata": {"name": self.side.namespace}}
        status, data = self.api.request("POST", "/api/v1/namespaces", ns)
        if status not in (201, 409):
            raise RuntimeError(f"namespace {self.side.namespace}: {status} {data[:200]!r}")
        # A fresh API server holds the first create of a kind for about 2 s: a dry run takes
        # that hit and stores nothing.
        self.api.json("POST", f"{self.side.path()}?dryRun=All", self.side.manifest(99999))
        time.sleep(2.0)  # the controller idle, before the first CR

    def run(self, pid: int) -> bool:
        side = self.side
        self.prepare(pid)
        assert self.rss is not None
        before = time.monotonic() - self.rss.t0
        self.result["rss_before_first_cr_mb"] = mb(proc_status_kib(pid, "VmRSS"))
        self.result["rss_split_before_first_cr_mb"] = rss_split(pid)
        self.result["vmhwm_before_first_cr_mb"] = mb(proc_status_kib(pid, "VmHWM"))
        writes0 = scrape_writes(self.api)
        mark0 = self.recording.mark()
        cpu0 = proc_cpu_seconds(pid)
        load0 = os.getloadavg()[0]
        log(f"{side.label}: creating {self.n} {side.kind} CRs in {side.namespace}")
        sent: dict[str, float] = {}
        ready_at: dict[str, float] = {}
        started = time.time()
        create_end: list[float] = []

        def post(i: int) -> None:
            body = side.manifest(i)
            name = body["metadata"]["name"]
            sent[name] = time.time()
            status, data = self.api.request("POST", side.path(), body)
            if status != 201:
                self.errors.append(f"create {name}: {status} {data[:200]!r}")

        def creator() -> None:
            with ThreadPoolExecutor(self.o.create_workers, thread_name_prefix="create") as pool:
                list(pool.map(post, range(self.n)))
            create_end.append(time.time())

        thread = threading.Thread(target=creator, name="creator", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.o.timeout
        all_ready: float | None = None
        mark_ready = mark0
        while time.monotonic() < deadline:
            tick = time.monotonic()
            now = time.time()
            for item in self.api.list_items(side.path()):
                name = item["metadata"]["name"]
                if name not in ready_at and side.ready(item):
                    ready_at[name] = now
            if create_end and len(ready_at) >= self.n - len(self.errors):
                all_ready = time.time()
                mark_ready = self.recording.mark()
                break
            time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - tick)))
        thread.join(timeout=60)
        cpu_ready = proc_cpu_seconds(pid)
        at_ready = time.monotonic() - self.rss.t0
        split = self.result["rss_split_at_all_ready_mb"] = rss_split(pid)
        self.result["rss_anon_at_all_ready_mb"] = split["RssAnon"]
        self.result["rss_file_at_all_ready_mb"] = split["RssFile"]
        mark1, settle_s = self.settle()
        writes1 = scrape_writes(self.api)
        entries = read_entries(self.recording.path, mark0[0], mark1[0])
        calls = calls_by_bucket(entries, self.recording, self.endpoint_host)
        calls_at_ready = calls_by_bucket(
            read_entries(self.recording.path, mark0[0], mark_ready[0]),
            self.recording,
            self.endpoint_host,
        )
        codes = self.recording.calls(mark0, mark1)["moto_status_codes"]
        times = [ready_at[k] - sent[k] for k in ready_at if k in sent]
        created = self.n - len(self.errors)
        self.result.update(
            {
                "created": created,
                "create_seconds": rounded(create_end[0] - started if create_end else None, 2),
                "ready": len(ready_at),
                "all_ready_seconds": rounded(all_ready - started if all_ready else None, 2),
                "time_to_ready_p50_s": rounded(percentile(times, 50), 2),
                "time_to_ready_p99_s": rounded(percentile(times, 99), 2),
                "aws_calls_per_bucket": round(calls["total"] / max(1, created), 2),
                "aws_calls_per_bucket_at_all_ready": round(
                    calls_at_ready["total"] / max(1, created), 2
                ),
                "aws_calls": calls,
                "moto_status_codes": codes,
                "settle_seconds": round(settle_s, 1),
                "rss_max_create_to_ready_mb": mb(self.rss.max_between(before, at_ready)),
                "cpu_seconds_create_to_ready": rounded(
                    None if cpu0 is None or cpu_ready is None else cpu_ready - cpu0, 2
                ),
                "api_writes_to_ready": api_writes(
                    write_delta(writes0, writes1), side.group, side.plural
                ),
                "loadavg_1m": {"create": round(load0, 2), "ready": round(os.getloadavg()[0], 2)},
            }
        )
        self.result["api_writes_per_cr_to_ready"] = round(
            self.result["api_writes_to_ready"]["total"] / max(1, created), 2
        )
        ok = all_ready is not None
        if not ok:
            self.errors.append(
                f"{len(ready_at)}/{created} {side.condition} after {self.o.timeout}s"
            )
        ok = self.delete() and ok
        return ok and not self.errors

    def settle(self, quiet: float = 3.0, cap: float = 30.0) -> tuple[tuple[int, int], float]:
        """Wait until moto has recorded no request for `quiet` seconds (at most `cap`)."""
        started = time.monotonic()
        last = self.recording.mark()
        changed = started
        while time.monotonic() - started < cap:
            time.sleep(0.5)
            now = self.recording.mark()
            if now != last:
                last, changed = now, time.monotonic()
            elif time.monotonic() - changed >= quiet:
                break
        return last, time.monotonic() - started

    def delete(self) -> bool:
        side = self.side
        log(f"{side.label}: deleting every {side.kind}")
        mark0 = self.recording.mark()
        started = time.time()
        status, data = self.api.request("DELETE", side.path())
        asked, retries = time.monotonic(), 0
        deadline = time.monotonic() + self.o.timeout
        gone: float | None = None
        remaining = -1
        while time.monotonic() < deadline:
            items = self.api.list_items(side.path())
            remaining = len(items)
            if remaining == 0:
                gone = time.time()
                break
            waiting = any(not item["metadata"].get("deletionTimestamp") for item in items)
            if waiting and time.monotonic() - asked >= DELETE_RETRY:
                # The API server gave up on the collection part-way (a 504 under load, or a
                # success that did not reach every CR): the CRs it had not reached are not
                # being deleted. Ask again for the rest.
                status, data = self.api.request("DELETE", side.path())
                asked, retries = time.monotonic(), retries + 1
            time.sleep(POLL_INTERVAL)
        if status >= 300 and gone is None:
            self.errors.append(f"delete {side.path()}: {status} {data[:200]!r}")
        self.settle(cap=15.0)
        mark1 = self.recording.mark()
        left = [b["Name"] for b in self.cloud.client("s3").list_buckets().get("Buckets") or []]
        deleted_calls = calls_by_bucket(
            read_entries(self.recording.path, mark0[0], mark1[0]),
            self.recording,
            self.endpoint_host,
        )
        self.result.update(
            {
                "all_deleted_seconds": rounded(gone - started if gone else None, 2),
                "delete_collection_retries": retries,
                "crs_left": max(0, remaining),
                "buckets_left_in_moto": len(left),
                "buckets_left_sample": left[:5],
                "aws_calls_per_bucket_to_delete": round(deleted_calls["total"] / max(1, self.n), 2),
                "aws_calls_delete": deleted_calls,
            }
        )
        if gone is None:
            self.errors.append(f"{remaining} {side.kind} CRs still there after {self.o.timeout}s")
        if left:
            self.errors.append(f"{len(left)} buckets left in moto, e.g. {left[:3]}")
            remove_buckets(self.cloud, left)
        return gone is not None and not left

    def finish(self) -> None:
        """VmHWM and the RSS samples, read before the controller is stopped."""
        pid = self.pid
        hwm = proc_status_kib(pid, "VmHWM")
        if self.rss is not None:
            self.rss.stop()
            sampled = max((kib for _, kib in self.rss.samples), default=None)
            self.result["rss_samples"] = len(self.rss.samples)
            self.result["rss_sampled_max_mb"] = mb(sampled)
            self.result["rss_timeline_mb"] = [
                (t, mb(kib)) for t, kib in self.rss.samples[:: max(1, len(self.rss.samples) // 300)]
            ]
        self.result["peak_rss_mb"] = mb(hwm)
        self.result["cpu_seconds_total"] = rounded(proc_cpu_seconds(pid), 2)
        self.result["errors"] = self.errors[:20]
        self.result["ok"] = not self.errors


def remove_buckets(cloud: DevCloud, names: list[str]) -> None:
    """Delete what a controller left in moto (so that the next side starts from nothing)."""
    s3 = cloud.client("s3")
    for name in names:
        try:
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
                for o in (page.get("Versions") or []) + (page.get("DeleteMarkers") or []):
                    s3.delete_object(Bucket=name, Key=o["Key"], VersionId=o["VersionId"])
            s3.delete_bucket(Bucket=name)
        except Exception as exc:  # noqa: BLE001 - reported; moto is stopped at the end anyway
            log(f"could not remove bucket {name}: {exc}")


# -- the report ------------------------------------------------------------------------------------


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    """Ours at most 6 AWS calls per bucket to Ready; our peak RSS at most 1.2x ACK's."""
    ours, ack = doc.get("ours") or {}, doc.get("ack") or {}
    calls = ours.get("aws_calls_per_bucket")
    ratio = None
    if ours.get("peak_rss_mb") and ack.get("peak_rss_mb"):
        ratio = round(ours["peak_rss_mb"] / ack["peak_rss_mb"], 2)
    return {
        "calls_per_bucket": {
            "value": calls,
            "target": CALLS_PER_BUCKET_TARGET,
            "met": None if calls is None else calls <= CALLS_PER_BUCKET_TARGET,
        },
        "peak_rss_ratio": {
            "value": ratio,
            "target": RSS_RATIO_TARGET,
            "met": None if ratio is None else ratio <= RSS_RATIO_TARGET,
        },
    }


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return f"{text}{unit}"


def _verdict(check: dict[str, Any]) -> str:
    met = check.get("met")
    return "-" if met is None else ("met" if met else "MISSED")


ROWS: list[tuple[str, str, str, int]] = [
    ("buckets created", "created", "", 2),
    ("create time", "create_seconds", " s", 1),
    ("time to all Ready/Synced", "all_ready_seconds", " s", 1),
    ("per-bucket time to Ready p50", "time_to_ready_p50_s", " s", 1),
    ("per-bucket time to Ready p99", "time_to_ready_p99_s", " s", 1),
    ("AWS calls per bucket to Ready", "aws_calls_per_bucket", "", 2),
    ("  of them until all Ready", "aws_calls_per_bucket_at_all_ready", "", 2),
    ("RSS before the first CR", "rss_before_first_cr_mb", " MB", 1),
    ("RSS max, create -> all Ready", "rss_max_create_to_ready_mb", " MB", 1),
    ("peak RSS (VmHWM at the end)", "peak_rss_mb", " MB", 1),
    ("  at all Ready: anonymous", "rss_anon_at_all_ready_mb", " MB", 1),
    ("  at all Ready: file-backed", "rss_file_at_all_ready_mb", " MB", 1),
    ("CPU seconds, create -> all Ready", "cpu_seconds_create_to_ready", "", 2),
    ("API writes per CR to Ready", "api_writes_per_cr_to_ready", "", 2),
    ("time to all deleted", "all_deleted_seconds", " s", 1),
    ("AWS calls per bucket to delete", "aws_calls_per_bucket_to_delete", "", 2),
    ("buckets left in moto", "buckets_left_in_moto", "", 2),
]


def table(doc: dict[str, Any]) -> str:
    """The two controllers in columns, the targets after them, then which calls were made."""
    sides = [k for k in ("ack", "ours") if doc.get(k)]
    heads = [doc[k]["controller"] for k in sides]
    width = max(24, *(len(h) + 2 for h in heads))
    lines = [f"{'':34}" + "".join(f"{h:<{width}}" for h in heads)]
    for label, key, unit, digits in ROWS:
        cells = "".join(f"{_fmt(doc[k].get(key), unit, digits):<{width}}" for k in sides)
        lines.append(f"{label:34}{cells}".rstrip())
    t = doc.get("targets") or targets(doc)
    calls, ratio = t["calls_per_bucket"], t["peak_rss_ratio"]
    lines.append("")
    lines.append(
        f"target: ours <= {calls['target']:g} AWS calls per bucket to Ready: "
        f"{_fmt(calls['value'])} {_verdict(calls)}"
    )
    lines.append(
        f"target: our peak RSS <= {ratio['target']:g}x ACK's: {_fmt(ratio['value'], 'x')} "
        f"{_verdict(ratio)}"
    )
    for k in sides:
        side = doc[k]
        calls_doc = side.get("aws_calls") or {}
        created = max(1, side.get("created") or 1)
        per = ", ".join(
            f"{action} {count / created:.2f}"
            for action, count in (calls_doc.get("by_action") or {}).items()
        )
        unnamed = ", ".join(
            f"{action} {count}"
            for action, count in (calls_doc.get("naming_no_bucket") or {}).items()
        )
        lines.append("")
        lines.append(f"{side['controller']}: calls per bucket to Ready by action: {per or '-'}")
        lines.append(f"  naming no bucket (total): {unnamed or '-'}")
        spread = calls_doc.get("per_named_bucket") or {}
        lines.append(
            f"  per bucket named: min {_fmt(spread.get('min'))}, p50 {_fmt(spread.get('p50'))}, "
            f"max {_fmt(spread.get('max'))} over {calls_doc.get('buckets_named', 0)} buckets"
        )
        for problem in side.get("errors") or []:
            lines.append(f"  FAILED: {problem}")
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/ack.py",
        description="ACK's s3-controller and this operator side by side (bench/README.md).",
    )
    p.add_argument("--n", type=int, default=500, help="buckets per controller (500)")
    p.add_argument(
        "--only", choices=["ack", "ours"], help="run one side only (default: ACK, then ours)"
    )
    p.add_argument("--timeout", type=float, default=900, help="per phase, seconds (900)")
    p.add_argument("--create-workers", type=int, default=16, help="POSTs in flight (16)")
    p.add_argument("--json", type=Path, dest="json_path", metavar="PATH", help="write figures")
    p.add_argument("--workdir", type=Path, help="logs and data here, kept (default: a temp dir)")
    p.add_argument("--ack-version", default=ACK_VERSION, help=f"ACK's version ({ACK_VERSION})")
    p.add_argument(
        "--ack-binary",
        type=Path,
        help="an ACK s3-controller built elsewhere: put into the cache (with --ack-crds)",
    )
    p.add_argument(
        "--ack-crds", type=Path, help="with --ack-binary: the module's root, or a dir of CRDs"
    )
    p.add_argument(
        "--ack-arg",
        action="append",
        default=[],
        dest="ack_args",
        metavar="ARG",
        help="passed to ACK's controller (repeatable; --ack-arg=--log-level=debug)",
    )
    p.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="ARG",
        help="passed to `provisioner run` (repeatable)",
    )
    a = p.parse_args(argv)
    if a.n < 1:
        p.error("--n must be >= 1")
    if bool(a.ack_binary) != bool(a.ack_crds):
        p.error("--ack-binary and --ack-crds go together")
    return a


def run_ack(
    stack: Stack, api: KubeJson, opts: argparse.Namespace, run_id: str, binary: Path
) -> dict[str, Any]:
    side = ack_side(run_id)
    run = Run(side, opts.n, stack, api, opts)
    ack = AckController(
        binary=binary,
        kubeconfig=str(stack.kubeconfig),
        endpoint_url=stack.cloud.url,
        namespace=side.namespace,
        extra_args=opts.ack_args,
        log=stack.dir / "ack-s3-controller.log",
    )
    started = time.monotonic()
    try:
        ack.start()
        assert ack.proc is not None
        run.result["startup_seconds"] = round(time.monotonic() - started, 2)
        log(f"{side.label} up (pid {ack.proc.pid})")
        try:
            run.run(ack.proc.pid)
        except Exception as exc:  # noqa: BLE001 - reported; the controller is stopped below
            traceback.print_exc()
            run.errors.append(f"{type(exc).__name__}: {exc}")
        run.finish()
    finally:
        ack.stop()
    return run.result


def run_ours(stack: Stack, api: KubeJson, opts: argparse.Namespace) -> dict[str, Any]:
    side = ours_side()
    run = Run(side, opts.n, stack, api, opts)
    started = time.monotonic()
    op = stack.start_operator(args=opts.operator_args, cluster_id="bench")
    try:
        assert op.proc is not None
        run.result["startup_seconds"] = round(time.monotonic() - started, 2)
        log(f"{side.label} up (pid {op.proc.pid})")
        try:
            run.run(op.proc.pid)
        except Exception as exc:  # noqa: BLE001 - reported; the operator is stopped below
            traceback.print_exc()
            run.errors.append(f"{type(exc).__name__}: {exc}")
        run.finish()
    finally:
        op.stop()
    return run.result


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    stop_on_signals()
    binary: Path | None = None
    crds: Path | None = None
    if opts.only != "ours":
        try:
            if opts.ack_binary:
                binary, crds = adopt_ack(opts.ack_version, opts.ack_binary, opts.ack_crds)
            else:
                binary, crds = ensure_ack(opts.ack_version)
        except binaries.BuildError as exc:
            print(f"bench/ack.py: {exc}", file=sys.stderr)
            return 1
        log(f"ACK s3-controller {opts.ack_version}: {binary}")
    if opts.workdir:
        workdir = opts.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="provisioner-bench-ack-"))
    stack = Stack(dir=workdir, record=True)
    moto_with_aws_defaults(stack)
    code = 1
    doc: dict[str, Any] = {
        "n": opts.n,
        "ack_version": opts.ack_version,
        "ack_binary": None
        if binary is None
        else {"path": str(binary), "sha256": binaries._sha256(binary)},
        "operator_source": source_fingerprint(),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0]},
    }
    try:
        log(f"starting the control plane and moto in {workdir}")
        stack.start()
        api = KubeJson(stack.kubeconfig, pool_size=max(32, opts.create_workers))
        if binary is not None and crds is not None:
            install_crds(stack.kubeconfig, crds)
            doc["ack"] = run_ack(stack, api, opts, f"{int(time.time()) % 100000}", binary)
        if opts.only != "ack":
            doc["ours"] = run_ours(stack, api, opts)
        doc["targets"] = targets(doc)
        ok = all(doc[k].get("ok") for k in ("ack", "ours") if k in doc)
        code = 0 if ok else 1
        doc["ok"] = ok
        print(table(doc))
        if opts.json_path:
            opts.json_path.write_text(json.dumps(doc, indent=2) + "\n")
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        code = 130
    except Exception:  # noqa: BLE001 - reported; the stack is stopped below
        traceback.print_exc()
        code = 1
    finally:
        stack.stop()
        if code == 0 and not opts.workdir:
            stack.remove()
        else:
            log(f"logs and data kept in {workdir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
