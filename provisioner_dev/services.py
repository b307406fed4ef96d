"""The services a local stack runs beside its control plane, each a child process on
loopback: moto's server, the fault proxy, the operator and its conversion webhook."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from provisioner_dev.awsenv import DEV_CREDENTIALS, DEV_REGION, aws_env
from provisioner_dev.crds import conversion_answers
from provisioner_dev.processes import LoopbackService, fixed_port, free_port

# The cluster id the operator runs with unless told another.
DEV_CLUSTER_ID = "dev"


def http_up(url: str) -> bool:
    """Whether an HTTP server answers at `url` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback only
            return True
    except urllib.error.HTTPError:
        return True


@dataclass(kw_only=True)
class MotoServer(LoopbackService):
    # Where moto appends one JSON line per request (tests count cloud calls with it).
    record_to: Path | None = None
    # The address it listens on ("0.0.0.0" for a node's pods); `url` stays on loopback.
    host: str = "127.0.0.1"

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or free_port()
        env = dict(os.environ, **DEV_CREDENTIALS, AWS_DEFAULT_REGION=DEV_REGION)
        if self.record_to is not None:
            env.update(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(self.record_to))
        self.launch(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            lambda: http_up(f"{self.url}/moto-api/"),
            what="moto server",
            timeout=timeout,
            env=env,
        )


@dataclass(kw_only=True)
class FaultProxy(LoopbackService):
    """provisioner_dev.faultproxy as a child process in front of an upstream endpoint."""

    upstream: str
    rate: float = 0.0
    seed: int | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.port = self.port or free_port()
        args = [
            sys.executable,
            "-m",
            "provisioner_dev.faultproxy",
            f"--upstream={self.upstream}",
            f"--port={self.port}",
            f"--rate={self.rate}",
        ]
        if self.seed is not None:
            args.append(f"--seed={self.seed}")
        self.launch(
            args,
            lambda: http_up(f"{self.url}/__proxy__/stats"),
            what="fault proxy",
            timeout=timeout,
        )

    def _call(self, action: str, payload: dict | None = None) -> dict:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(  # noqa: S310 - loopback only
            f"{self.url}/__proxy__/{action}", data=data, method="POST" if data else "GET"
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
            return json.loads(resp.read())

    def stats(self) -> dict:
        return self._call("stats")

    def configure(self, **settings: object) -> dict:
        return self._call("config", dict(settings))


_RUN_FROM = (
    "import runpy, sys; sys.path.insert(0, {!r}); "
    "runpy.run_module('provisioner', run_name='__main__', alter_sys=True)"
)


@dataclass(kw_only=True)
class OperatorProcess(LoopbackService):
    """The operator run as a child process, the way a Deployment would run it.

    `port` is its liveness port, drawn anew at every start.
    """

    kubeconfig: str
    endpoint_url: str
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # Another copy of the operator's package to run (its parent directory), e.g. an older
    # release checked out of git; None: this one.
    package_dir: Path | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, **aws_env(self.endpoint_url))
        env.update(self.extra_env)
        env.setdefault("PROVISIONER_CLUSTER_ID", DEV_CLUSTER_ID)
        entry = ["-m", "provisioner"]
        if self.package_dir is not None:
            # First on sys.path, before the working directory `-m` would put there.
            entry = ["-c", _RUN_FROM.format(str(self.package_dir))]
        self.launch(
            [
                sys.executable,
                *entry,
                "run",
                f"--liveness-port={self.port}",
                *self.extra_args,
            ],
            lambda: http_up(f"{self.url}/healthz"),
            what="operator",
            timeout=timeout,
            env=env,
        )

    def stop(self, kill: bool = False, timeout: float = 15.0) -> None:
        super().stop(kill=kill, timeout=timeout)


@dataclass(kw_only=True)
class WebhookProcess(LoopbackService):
    """`provisioner webhook`: the CRDs' conversion webhook on loopback, apart from the
    operators, so that v1alpha1 objects can be written while an operator restarts."""

    kubeconfig: str
    # Where it serves its metrics (the reviews, the certificate's expiry); 0: none.
    metrics_port: int = 0

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or fixed_port()
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, PROVISIONER_NAMESPACE="default")
        self.launch(
            [
                sys.executable,
                "-m",
                "provisioner",
                "webhook",
                f"--webhook-port={self.port}",
                f"--metrics-port={self.metrics_port}",
            ],
            lambda: conversion_answers(self.kubeconfig),
            what="conversion webhook",
            timeout=timeout,
            env=env,
        )
