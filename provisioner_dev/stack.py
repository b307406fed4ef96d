"""The whole local setup: control plane, moto's server, CRDs and the operator.

`provisioner dev up` keeps its state in `.dev/` (git-ignored) and its data in a
temporary directory; `dev down` stops everything and removes both. A `.dev/` left
by a dead run is detected and cleaned by the next `dev up`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from provisioner_dev import binaries
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.cloudprofile import CloudProfile
from provisioner_dev.controlplane import ControlPlane, ControlPlaneState, healthy
from provisioner_dev.processes import LoopbackService, alive, free_port, stop

REPO_ROOT = binaries.REPO_ROOT
CRD_DIR = REPO_ROOT / "crds"
DEV_REGION = "us-east-1"
DEV_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _http_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback only
            return True
    except urllib.error.HTTPError:
        return True


@dataclass(kw_only=True)
class MotoServer(LoopbackService):
    # Where moto appends one JSON line per request (tests count cloud calls with it).
    record_to: Path | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or free_port()
        env = dict(os.environ, **DEV_CREDENTIALS, AWS_DEFAULT_REGION=DEV_REGION)
        if self.record_to is not None:
            env.update(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(self.record_to))
        self.launch(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            lambda: _http_up(f"{self.url}/moto-api/"),
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
            lambda: _http_up(f"{self.url}/__proxy__/stats"),
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


def aws_env(endpoint_url: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": DEV_REGION,
        "AWS_DEFAULT_REGION": DEV_REGION,
        **DEV_CREDENTIALS,
    }


def run_kubectl(
    kubeconfig: str | Path, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def kubectl(kubeconfig: str | Path, *args: str, input: str | None = None) -> str:
    result = run_kubectl(kubeconfig, *args, input=input)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def install_crds(kubeconfig: str | Path) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD_DIR))


@dataclass(kw_only=True)
class OperatorProcess(LoopbackService):
    """The operator run as a child process, the way a Deployment would run it.

    `port` is its liveness port, drawn anew at every start.
    """

    kubeconfig: str
    endpoint_url: str
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, **aws_env(self.endpoint_url))
        env.update(self.extra_env)
        env.setdefault("PROVISIONER_CLUSTER_ID", "dev")
        self.launch(
            [
                sys.executable,
                "-m",
                "provisioner",
                "run",
                f"--liveness-port={self.port}",
                *self.extra_args,
            ],
            lambda: _http_up(f"{self.url}/healthz"),
            what="operator",
            timeout=timeout,
            env=env,
        )

    def stop(self, kill: bool = False, timeout: float = 15.0) -> None:
        super().stop(kill=kill, timeout=timeout)


class DevStack:
    """The state behind `provisioner dev up/status/down`, kept in `.dev/`."""

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir
        self.state_file = dev_dir / "state.json"

    def load(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def running(self, state: dict) -> bool:
        pids = state.get("pids", {})
        if not pids or not all(alive(pid) for pid in pids.values()):
            return False
        return healthy(ControlPlaneState(**state["controlplane"]))

    def clean(self, state: dict | None) -> None:
        if state:
            for pid in state.get("pids", {}).values():
                if alive(pid):
                    stop(pid)
            shutil.rmtree(state.get("data_dir", ""), ignore_errors=True)
        for name in ("state.json", "env", "kubeconfig"):
            (self.dev_dir / name).unlink(missing_ok=True)

    def up(self, with_operator: bool = True, cloud: CloudProfile | None = None) -> dict:
        state = self.load()
        if state and self.running(state):
            return state
        if state:
            print("provisioner: found a stale .dev/ from a dead run; cleaning it", file=sys.stderr)
        self.clean(state)
        paths = binaries.ensure_binaries()
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="provisioner-dev-"))
        started = time.monotonic()
        cp = ControlPlane(data_dir / "controlplane", paths)
        moto = MotoServer(log=self.dev_dir / "moto.log")
        proxy = None
        operator = None
        try:
            cp_state = cp.start()
            moto.start()
            endpoint = moto.url
            if cloud is not None:  # the aws-like profile: a proxy in front of moto
                log = self.dev_dir / "awslike.log"
                proxy = AwsLikeProxy(
                    upstream=moto.url, profile=cloud.name, args=cloud.args, log=log
                )
                proxy.start()
                endpoint = proxy.url
            install_crds(cp.kubeconfig)
            kubeconfig = self.dev_dir / "kubeconfig"
            shutil.copy(cp.kubeconfig, kubeconfig)
            kubeconfig.chmod(0o600)
            if with_operator:
                operator = OperatorProcess(
                    kubeconfig=str(kubeconfig),
                    endpoint_url=endpoint,
                    log=self.dev_dir / "operator.log",
                )
                operator.start()
        except BaseException:
            if operator:
                operator.stop()
            if proxy:
                proxy.stop()
            moto.stop()
            cp.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        pids = dict(cp_state.pids)
        assert moto.proc is not None
        pids["moto"] = moto.proc.pid
        if proxy and proxy.proc:
            pids["awslike"] = proxy.proc.pid
        if operator and operator.proc:
            pids["operator"] = operator.proc.pid
        state = {
            "data_dir": str(data_dir),
            "controlplane": cp_state.to_json(),
            "kubeconfig": str(self.dev_dir / "kubeconfig"),
            "moto_url": moto.url,
            "cloud_profile": cloud.name if cloud else "instant",
            "cloud_url": endpoint,
            "pids": pids,
            "started_in_seconds": round(time.monotonic() - started, 2),
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        env_lines = {
            "KUBECONFIG": str((self.dev_dir / "kubeconfig").resolve()),
            **aws_env(endpoint),
        }
        (self.dev_dir / "env").write_text(
            "".join(f"export {k}={v}\n" for k, v in env_lines.items())
        )
        return state

    def down(self) -> bool:
        state = self.load()
        self.clean(state)
        return state is not None
