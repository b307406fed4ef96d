"""Jaeger all-in-one (https://www.jaegertracing.io) beside a stack, to see the operator's traces.

It is built like kro: from a pinned Go module (hack/jaeger), on demand, once per machine,
cached in ~/.cache/provisioner/jaeger-<version>/. Jaeger v1.75's `jaeger` binary is the
OpenTelemetry-collector-based one: it runs from a configuration file, written here with
in-memory storage, an OTLP/HTTP receiver on one free loopback port and the query service
(HTTP API under /api, and the UI page) on another. The Go module carries no built UI
assets, so the UI page is Jaeger's placeholder; the query API is complete.

    jaeger = start_jaeger(log_dir)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, ...}
    trace = jaeger.trace(trace_id)   # the trace as Jaeger's query API returns it, or None
    jaeger.stop()
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner_dev.binaries import REPO_ROOT, Component, cached_binaries, ensure
from provisioner_dev.processes import LoopbackService, free_port
from provisioner_dev.services import http_up

JAEGER_VERSION = "v1.75.0"
JAEGER_MODULE = "github.com/jaegertracing/jaeger"


def jaeger_component() -> Component:
    return Component(
        name="jaeger",
        version=JAEGER_VERSION,
        module_dir=REPO_ROOT / "hack" / "jaeger",
        packages={"jaeger": f"{JAEGER_MODULE}/cmd/jaeger"},
        ldflags=f"-s -w -X {JAEGER_MODULE}/internal/version.latestVersion={JAEGER_VERSION}",
    )


def cached_jaeger() -> Path | None:
    """The cached binary if it is built and intact; never builds."""
    found = cached_binaries(jaeger_component())
    return found["jaeger"] if found else None


def ensure_jaeger() -> Path:
    """Jaeger all-in-one, built on demand (once per machine); BuildError if it cannot be."""
    return ensure(jaeger_component())["jaeger"]


def jaeger_config(otlp_port: int, query_port: int, health_port: int) -> str:
    """A minimal all-in-one configuration: OTLP over HTTP in, memory storage, query out.

    The collector's own telemetry is off (no metrics port, no traces of itself)."""
    return f"""\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health_port}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:0
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


@dataclass(kw_only=True)
class Jaeger(LoopbackService):
    """Jaeger all-in-one as a child process; `port` is its query service (API and UI)."""

    binary: Path
    otlp_port: int = 0
    health_port: int = 0

    @property
    def otlp_endpoint(self) -> str:
        """The value for OTEL_EXPORTER_OTLP_ENDPOINT (OTLP over HTTP; /v1/traces is appended)."""
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def ui_url(self) -> str:
        return f"{self.url}/"

    def start(self, timeout: float = 60.0) -> None:
        # Ports given (a restart at the same addresses) are kept; the others are picked.
        self.port = self.port or free_port()
        self.otlp_port = self.otlp_port or free_port()
        self.health_port = self.health_port or free_port()
        config = self.log.with_suffix(".yaml")
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(jaeger_config(self.otlp_port, self.port, self.health_port))
        self.launch(
            [str(self.binary), f"--config={config}"],
            lambda: http_up(f"{self.url}/api/services") and http_up(self.otlp_endpoint),
            what="jaeger",
            timeout=timeout,
        )

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace `trace_id` (32 hex digits) from the query API, or None if Jaeger has
        none (yet: spans arrive in batches)."""
        return fetch_trace(self.url, trace_id)

    def traces(self, service: str, limit: int = 100) -> list[dict[str, Any]]:
        """The latest traces of `service` (one lookback hour)."""
        query = f"service={service}&limit={limit}&lookback=1h"
        return list(_get_json(f"{self.url}/api/traces?{query}").get("data") or [])


def fetch_trace(query_url: str, trace_id: str) -> dict[str, Any] | None:
    """One trace from a Jaeger query service at `query_url` (GET /api/traces/<id>), or None."""
    try:
        body = _get_json(f"{query_url.rstrip('/')}/api/traces/{trace_id}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    data = body.get("data") or []
    return dict(data[0]) if data else None


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback only
        return dict(json.loads(resp.read()))


def start_jaeger(
    log_dir: Path, timeout: float = 60.0, *, port: int = 0, otlp_port: int = 0
) -> Jaeger:
    """Build Jaeger if needed (BuildError if it cannot be) and start it, on the ports given
    (0: free ones); `stop()` ends it."""
    jaeger = Jaeger(binary=ensure_jaeger(), log=log_dir / "jaeger.log")
    jaeger.port, jaeger.otlp_port = port, otlp_port
    jaeger.start(timeout=timeout)
    return jaeger
