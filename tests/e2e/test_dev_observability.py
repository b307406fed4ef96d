"""`provisioner dev up --observability`: Prometheus beside the dev stack, scraping its
operator, and Jaeger receiving its traces; `dev status` and `dev down` know them; a dead one is
started again alone, at the same address; a stack started without them is not changed behind
the developer's back.

Prometheus and Jaeger are built from hack/prometheus and hack/jaeger (cached); the tests are
skipped, saying why, only when they cannot be built.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner_dev.binaries import BuildError
from provisioner_dev.jaeger import ensure_jaeger, fetch_trace
from provisioner_dev.processes import alive
from provisioner_dev.prometheus import ensure_prometheus, query
from tests.conftest import needs_own_controlplane
from tests.e2e.test_dev_cli import (
    DevCluster,
    dev,
    dev_env,
    one_line_with,
    process_line,
    queue,
    read_state,
)
from tests.e2e.test_tracing import created_trace
from tests.helpers import apply, wait_for, wait_ready

pytestmark = [pytest.mark.e2e, needs_own_controlplane]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A directory to run `dev up` in; whatever it started is stopped at the end."""
    try:
        ensure_prometheus()
        ensure_jaeger()
    except BuildError as exc:
        pytest.skip(f"Prometheus or Jaeger cannot be built (hack/prometheus, hack/jaeger): {exc}")
    yield tmp_path
    if (tmp_path / ".dev/state.json").exists():
        pids = read_state(tmp_path)["pids"]
        dev(tmp_path, "down")
        wait_for(
            lambda: not any(alive(pid) for pid in pids.values()),
            timeout=30,
            what="every process of the dev environment to stop",
        )


def scraped(url: str) -> bool:
    """Prometheus at `url` has scraped the operator: its target is up and its series are in."""
    up = query(url, 'up{job="provisioner"} == 1')
    return bool(up) and bool(query(url, "provisioner_reconcile_total"))


def reconciled(trace: dict | None) -> dict | None:
    """The trace, once it holds the reconcile pass's own span."""
    spans = (trace or {}).get("spans") or []
    return trace if any(s["operationName"] == "reconcile Queue" for s in spans) else None


def test_up_with_observability_scrapes_the_operator_status_and_down_know_it(workdir):
    up = dev(workdir, "up", "--observability")
    assert up.returncode == 0, up.stderr
    url = one_line_with(up.stdout, "prometheus:").split()[-1]
    state = read_state(workdir)
    assert state["observability"]["prometheus"]["url"] == url
    metrics = f"http://127.0.0.1:{state['metrics_port']}/metrics"
    assert metrics in up.stdout
    assert f"PROVISIONER_METRICS_PORT={state['metrics_port']}" in (workdir / ".dev/env").read_text()
    wait_for(lambda: scraped(url), timeout=120, what="Prometheus to scrape the operator")

    # Jaeger receives the operator's traces: a Queue's Created Event names its trace.
    jaeger = one_line_with(up.stdout, "jaeger:").split()[-1]
    assert state["observability"]["jaeger"]["url"] == jaeger
    endpoint = state["observability"]["jaeger"]["operator_env"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert dev_env(workdir)["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    kube = DevCluster(workdir)
    kube.kubectl("create", "namespace", "app")
    apply(kube, "app", queue("traced"))
    wait_ready(kube, "queue", "app", "traced", timeout=120)
    trace = created_trace(kube, "app", "traced")
    # Spans arrive in batches: the pass's own span ends last, so it may come after the others.
    found = wait_for(
        lambda: reconciled(fetch_trace(jaeger, trace)),
        timeout=60,
        what=f"trace {trace} in Jaeger with its `reconcile Queue` span",
    )
    assert found["traceID"] == trace

    status = dev(workdir, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "running" in process_line(status.stdout, "prometheus")
    assert f"prometheus: {url} ready" in status.stdout
    assert "running" in process_line(status.stdout, "jaeger")

    # Killed: status says so; the next `dev up` starts it again alone, at the same address.
    prometheus = state["processes"]["prometheus"]["pid"]
    moto = state["processes"]["moto"]["pid"]
    os.kill(prometheus, signal.SIGKILL)
    wait_for(lambda: not alive(prometheus), timeout=30, what="prometheus to die")
    status = dev(workdir, "status")
    assert status.returncode == 1 and "DEAD" in process_line(status.stdout, "prometheus")
    assert f"prometheus: {url} DEAD" in status.stdout
    assert "`provisioner dev up` starts prometheus again and keeps the rest" in status.stdout
    again = dev(workdir, "up")
    assert again.returncode == 0, again.stderr
    assert "prometheus not running; starting it again" in again.stderr
    restarted = read_state(workdir)
    assert restarted["processes"]["prometheus"]["pid"] != prometheus
    assert restarted["processes"]["moto"]["pid"] == moto  # the rest was kept
    assert restarted["observability"]["prometheus"]["url"] == url
    assert restarted["processes"]["jaeger"]["pid"] == state["processes"]["jaeger"]["pid"]
    wait_for(lambda: scraped(url), timeout=120, what="the new Prometheus to scrape the operator")

    pids = restarted["pids"]
    data = Path(restarted["data_dir"]) / "prometheus"
    assert data.is_dir()
    down = dev(workdir, "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    backends = (pids["prometheus"], pids["jaeger"])
    wait_for(lambda: not any(map(alive, backends)), timeout=30, what="the backends to stop")
    assert not data.exists()


def test_observability_is_not_added_to_a_running_stack_without_it(workdir):
    up = dev(workdir, "up", "--no-operator")
    assert up.returncode == 0, up.stderr
    assert "prometheus" not in up.stdout and "metrics_port" not in read_state(workdir)
    refused = dev(workdir, "up", "--no-operator", "--observability")
    assert refused.returncode == 1
    assert "has no observability backends: `provisioner dev down` first" in refused.stderr
    assert not {"prometheus", "jaeger"} & set(read_state(workdir)["processes"])
