"""Prometheus and promtool (https://prometheus.io) beside a stack: the alert rules' tests, the
dashboards' queries and `provisioner dev up --observability`.

Both are built like kro: from a pinned Go module (hack/prometheus), on demand, once per machine,
cached in ~/.cache/provisioner/prometheus-<version>/. The build leaves out the web UI's assets
(the HTTP API is what is used) and every service discovery but the file and HTTP ones
(`remove_all_sd`): the targets are static. The server runs as a child process with a
configuration written here, scraping the given targets every second:

    prometheus = start_prometheus(log_dir, {"provisioner": ["127.0.0.1:9090"]})
    prometheus.wait_for_scrape("provisioner", timeout=60)
    series = prometheus.query('sum by (kind) (provisioner_resources{condition="Ready"})')
    prometheus.stop()
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner_dev.binaries import REPO_ROOT, Component, cached_binaries, ensure
from provisioner_dev.processes import LoopbackService, free_port
from provisioner_dev.services import http_up

# The Go module's version; Prometheus's own release is 3.16.0.
PROMETHEUS_MODULE_VERSION = "v0.316.0"
PROMETHEUS_VERSION = "3.16.0"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
SCRAPE_INTERVAL = "1s"


def prometheus_component() -> Component:
    version_pkg = "github.com/prometheus/common/version"
    return Component(
        name="prometheus",
        version=PROMETHEUS_MODULE_VERSION,
        module_dir=REPO_ROOT / "hack" / "prometheus",
        packages={
            "prometheus": f"{PROMETHEUS_MODULE}/cmd/prometheus",
            "promtool": f"{PROMETHEUS_MODULE}/cmd/promtool",
        },
        ldflags=" ".join(
            [
                "-s -w",
                f"-X {version_pkg}.Version={PROMETHEUS_VERSION}",
                f"-X {version_pkg}.Branch=release-{PROMETHEUS_VERSION.rsplit('.', 1)[0]}",
                f"-X {version_pkg}.BuildUser=provisioner",
            ]
        ),
        tags="netgo,remove_all_sd",
    )


def cached_prometheus() -> dict[str, Path] | None:
    """The cached `prometheus` and `promtool` if they are built and intact; never builds."""
    return cached_binaries(prometheus_component())


def ensure_prometheus() -> dict[str, Path]:
    """`prometheus` and `promtool`, built on demand (once per machine); BuildError if they
    cannot be."""
    return ensure(prometheus_component())


def ensure_promtool() -> Path:
    return ensure_prometheus()["promtool"]


class QueryError(RuntimeError):
    """Prometheus refused a query (it does not parse, or failed); the message is its error."""


def scrape_config(
    targets: dict[str, list[str]],
    interval: str = SCRAPE_INTERVAL,
    rule_files: list[Path] | None = None,
) -> str:
    """A configuration scraping each job's `host:port` targets at /metrics and evaluating
    `rule_files` at the same interval (JSON is YAML)."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files or []],
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(addresses)}],
            }
            for job, addresses in targets.items()
        ],
    }
    return json.dumps(config, indent=2)


@dataclass(kw_only=True)
class PrometheusServer(LoopbackService):
    """The Prometheus server as a child process; `port` is its HTTP API."""

    binary: Path
    targets: dict[str, list[str]] = field(default_factory=dict)
    # Rule files it evaluates (alerting and recording rules).
    rule_files: list[Path] = field(default_factory=list)
    # Its TSDB; None: a temporary directory removed by stop().
    data_dir: Path | None = None
    _own_data: bool = False

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="provisioner-prometheus-"))
            self._own_data = True
        config = self.log.with_suffix(".yml")
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(scrape_config(self.targets, rule_files=self.rule_files))
        self.launch(
            [
                str(self.binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ],
            lambda: http_up(f"{self.url}/-/ready") and _ready(self.url),
            what="prometheus",
            timeout=timeout,
        )

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        super().stop(kill=kill, timeout=timeout)
        if self._own_data and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (`[]` for none); QueryError if refused."""
        return query(self.url, expr)

    def rules(self) -> list[dict[str, Any]]:
        """Every rule loaded, as /api/v1/rules shows it (health, state, lastError...)."""
        body = _get_json(f"{self.url}/api/v1/rules")
        return [rule for group in body["data"]["groups"] for rule in group["rules"]]

    def targets_health(self, job: str) -> list[dict[str, Any]]:
        """The active targets of `job` as /api/v1/targets shows them."""
        body = _get_json(f"{self.url}/api/v1/targets?state=active")
        return [t for t in body["data"]["activeTargets"] if t["labels"].get("job") == job]

    def scrapes(self, job: str) -> int:
        """How many scrapes (failed ones too) Prometheus has made of the least scraped of
        `job`'s targets in the last hour."""
        counted = self.query(f'count_over_time(up{{job="{job}"}}[1h])')
        return min((int(float(s["value"][1])) for s in counted), default=0)

    def wait_for_scrape(self, job: str, timeout: float, scrapes: int = 2) -> None:
        """Until every target of `job` is up and has been scraped `scrapes` more times from
        now (two samples: what rate() needs); TimeoutError naming the targets' last error."""
        deadline = time.monotonic() + timeout
        want = len(self.targets.get(job, [])) or 1
        start = self.scrapes(job)
        while True:
            up = self.query(f'up{{job="{job}"}} == 1')
            if len(up) >= want and self.scrapes(job) >= start + scrapes:
                return
            if time.monotonic() > deadline:
                errors = [t.get("lastError") or t.get("health") for t in self.targets_health(job)]
                raise TimeoutError(
                    f"prometheus scraped no {job} target in {timeout:.0f}s: {errors}"
                )
            time.sleep(0.2)


def _ready(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:  # noqa: S310 - loopback
        return int(resp.status) == 200


def _get_json(url: str, data: bytes | None = None) -> dict[str, Any]:
    request = urllib.request.Request(url, data=data)  # noqa: S310 - loopback only
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        # A refused query is a 400 or 422 whose body says why.
        try:
            return dict(json.loads(exc.read()))
        except ValueError:
            raise exc from None


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """POST /api/v1/query at the Prometheus at `url`: the instant vector's series, each
    `{"metric": {...}, "value": [time, "value"]}`; a scalar or string is one series without
    labels. QueryError with Prometheus's message if it refuses the expression."""
    body = _get_json(f"{url}/api/v1/query", urllib.parse.urlencode({"query": expr}).encode())
    if body.get("status") != "success":
        raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return list(data["result"])


def start_prometheus(
    log_dir: Path, targets: dict[str, list[str]], timeout: float = 60.0
) -> PrometheusServer:
    """Build Prometheus if needed (BuildError if it cannot be) and start it scraping
    `targets` (job -> `host:port` list); `stop()` ends it and removes its data."""
    server = PrometheusServer(
        binary=ensure_prometheus()["prometheus"], targets=targets, log=log_dir / "prometheus.log"
    )
    server.start(timeout=timeout)
    return server


def promtool(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run the built promtool (building it if needed) with `args`; its output, any exit code."""
    return subprocess.run(
        [str(ensure_promtool()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
