"""Operators of a test's own, in an `own-*` namespace the session operator leaves alone;
and, for tests that restart the API server, a whole stack of the test's own."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from provisioner_dev.services import FaultProxy, OperatorProcess
from tests.conftest import (
    TEST_RESYNC_SECONDS,
    AwsClients,
    Cluster,
    aws_clients,
    fresh_namespace,
    needs_own_controlplane,
    running_cluster,
)


@pytest.fixture
def own_namespace(cluster: Cluster) -> Iterator[str]:
    yield from fresh_namespace(cluster, "own")


StartOperator = Callable[..., OperatorProcess]


@contextmanager
def operators(cluster: Cluster, namespace: str) -> Iterator[StartOperator]:
    """Start operators watching only `namespace`; all are stopped at the end."""
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
            log=cluster.dir / f"operator-{namespace}-{len(started)}.log",
            args=[
                f"--namespace={namespace}",
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

    try:
        yield start
    finally:
        for op in started:
            op.stop()


@pytest.fixture
def start_operator(cluster: Cluster, own_namespace: str) -> Iterator[StartOperator]:
    with operators(cluster, own_namespace) as start:
        yield start


@dataclass
class OwnStack:
    kube: Cluster
    aws: AwsClients
    namespace: str
    start_operator: StartOperator


@pytest.fixture
def own_stack() -> Iterator[OwnStack]:
    """A control plane, cloud and operators of the test's own (a few seconds to start).

    For tests that restart the API server (or another shared process): on the shared control
    plane, the restart would reach the session operator, whose log must show no 403 at all.
    """
    if needs_own_controlplane.args[0]:
        pytest.skip(needs_own_controlplane.kwargs["reason"])
    with running_cluster() as kube:
        namespace = "own-stack"
        kube.kubectl("create", "namespace", namespace)
        with operators(kube, namespace) as start:
            yield OwnStack(kube, aws_clients(kube.moto.url), namespace, start)


@pytest.fixture
def fault_proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    proxy = FaultProxy(
        upstream=cluster.moto.url, log=cluster.dir / f"proxy-{uuid.uuid4().hex[:6]}.log"
    )
    proxy.start()
    yield proxy
    proxy.stop()
