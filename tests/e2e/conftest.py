"""Operators of a test's own, in an `own-*` namespace the session operator leaves alone."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from provisioner_dev.stack import FaultProxy, OperatorProcess
from tests.conftest import TEST_RESYNC_SECONDS, Cluster, fresh_namespace


@pytest.fixture
def own_namespace(cluster: Cluster) -> Iterator[str]:
    yield from fresh_namespace(cluster, "own")


StartOperator = Callable[..., OperatorProcess]


@pytest.fixture
def start_operator(cluster: Cluster, own_namespace: str) -> Iterator[StartOperator]:
    """Start operators watching only `own_namespace`; all are stopped at the end."""
    started: list[OperatorProcess] = []

    def start(
        *,
        endpoint_url: str | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        kubeconfig: str | None = None,
        wait: bool = True,
    ) -> OperatorProcess:
        op = cluster.stack.start_operator(
            kubeconfig=kubeconfig,
            endpoint_url=endpoint_url or cluster.moto.url,
            log=cluster.dir / f"operator-{own_namespace}-{len(started)}.log",
            args=[
                f"--namespace={own_namespace}",
                f"--resync-seconds={TEST_RESYNC_SECONDS}",
                *(args or []),
            ],
            env={"PROVISIONER_CLUSTER_ID": "test", **(env or {})},
            wait=False,
        )
        started.append(op)
        if wait:
            op.start()
        return op

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def fault_proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    proxy = FaultProxy(
        upstream=cluster.moto.url, log=cluster.dir / f"proxy-{uuid.uuid4().hex[:6]}.log"
    )
    proxy.start()
    yield proxy
    proxy.stop()
