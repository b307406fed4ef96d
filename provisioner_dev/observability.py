"""What `provisioner dev up --observability` runs beside the operator: its backends.

Each backend is a `Backend`: a name, how to start it for a dev environment (a LoopbackService
that outlives `dev up`, like the operator), the environment the operator then needs (an
exporter's endpoint), and the address `dev up` prints. `.dev/state.json` records each one under
`observability` (its address, its port, the operator's environment) and its process under
`processes` with the part `observability`: a dead backend is started again by the next `dev up`
and the rest is kept, as for the operator. Adding one is an entry in BACKENDS.

Two run: Prometheus scraping the operator's metrics, and Jaeger receiving its traces (the
operator is given OTEL_EXPORTER_OTLP_ENDPOINT, which turns tracing on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner_dev.devstate import OBSERVABILITY
from provisioner_dev.jaeger import Jaeger, start_jaeger
from provisioner_dev.processes import LoopbackService, fixed_port
from provisioner_dev.prometheus import PrometheusServer, ensure_prometheus

# The scrape job of the operator in the dev Prometheus.
OPERATOR_JOB = "provisioner"


def _no_env(_: Any) -> dict[str, Any]:
    return {}


def _url(service: Any) -> str:
    return str(service.url)


@dataclass(frozen=True)
class Backend:
    name: str
    # (dev directory, state, port to reuse or 0) -> the started service.
    start: Callable[[Path, dict[str, Any], int], LoopbackService]
    operator_env: Callable[[Any], dict[str, str]] = field(default=_no_env)
    address: Callable[[Any], str] = field(default=_url)
    # More to record in the state, for starting it again as it was.
    record: Callable[[Any], dict[str, Any]] = field(default=_no_env)


def start_prometheus(dev_dir: Path, state: dict[str, Any], port: int) -> PrometheusServer:
    """Prometheus scraping the operator's metrics port (`state["metrics_port"]`) every second,
    its data in the environment's data directory (removed by `dev down`)."""
    data = Path(state["data_dir"]) / "prometheus"
    data.mkdir(parents=True, exist_ok=True)
    server = PrometheusServer(
        binary=ensure_prometheus()["prometheus"],
        targets={OPERATOR_JOB: [f"127.0.0.1:{state['metrics_port']}"]},
        data_dir=data,
        port=port or fixed_port(),
        log=dev_dir / "prometheus.log",
    )
    server.start(timeout=120)
    return server


def start_jaeger_backend(dev_dir: Path, state: dict[str, Any], port: int) -> Jaeger:
    """Jaeger receiving the operator's traces over OTLP/HTTP; started again, it keeps both
    its query port and the OTLP port the operator was given."""
    otlp_port = 0
    if port:
        recorded = state.get(OBSERVABILITY, {}).get("jaeger", {})
        otlp_port = int(recorded.get("otlp_port", 0))
    return start_jaeger(
        dev_dir, timeout=120, port=port or fixed_port(), otlp_port=otlp_port or fixed_port()
    )


def _jaeger_env(jaeger: Jaeger) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint}


BACKENDS: tuple[Backend, ...] = (
    Backend("prometheus", start=start_prometheus),
    Backend(
        "jaeger",
        start=start_jaeger_backend,
        operator_env=_jaeger_env,
        record=lambda jaeger: {"otlp_port": jaeger.otlp_port},
    ),
)


def start_backends(dev_dir: Path, state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Start the backends named (those already recorded reuse their port), record them in
    `state["observability"]`, and return the started services by name (on failure, those
    started are stopped)."""
    started: dict[str, Any] = {}
    recorded = state.setdefault(OBSERVABILITY, {})
    by_name = {b.name: b for b in BACKENDS}
    try:
        for name in names:
            backend = by_name[name]
            service = backend.start(dev_dir, state, int(recorded.get(name, {}).get("port", 0)))
            started[name] = service
            recorded[name] = {
                "url": backend.address(service),
                "port": service.port,
                "operator_env": backend.operator_env(service),
            }
            recorded[name].update(backend.record(service))
    except BaseException:
        for service in started.values():
            service.stop()
        raise
    return started


def operator_env(state: dict[str, Any]) -> dict[str, str]:
    """The environment the operator needs for the backends recorded in `state`."""
    env: dict[str, str] = {}
    for entry in (state.get(OBSERVABILITY) or {}).values():
        env.update(entry.get("operator_env") or {})
    return env


def names() -> list[str]:
    return [b.name for b in BACKENDS]
