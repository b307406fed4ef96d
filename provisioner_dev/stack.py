"""The whole local setup: control plane, moto's server, CRDs and the operator.

`provisioner dev up` keeps its state in `.dev/` (git-ignored) and its data in a
temporary directory; `dev down` stops everything and removes both. A second `dev up`
restarts only what is not running: a dead operator is started again against the same
control plane and moto; only a dead control plane or moto makes it start over.
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
from provisioner_dev.controlplane import ControlPlaneState, healthy
from provisioner_dev.processes import (
    LoopbackService,
    StartError,
    fixed_port,
    free_port,
    same_alive,
    start_time,
    stop,
    wait_until,
)

REPO_ROOT = binaries.REPO_ROOT
CRD_DIR = REPO_ROOT / "crds"
DEV_REGION = "us-east-1"
DEV_CLUSTER_ID = "dev"
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
    # The address it listens on ("0.0.0.0" for a node's pods); `url` stays on loopback.
    host: str = "127.0.0.1"

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or free_port()
        env = dict(os.environ, **DEV_CREDENTIALS, AWS_DEFAULT_REGION=DEV_REGION)
        if self.record_to is not None:
            env.update(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(self.record_to))
        self.launch(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
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


def install_crds(kubeconfig: str | Path, crd_dir: Path = CRD_DIR) -> None:
    """Apply the CRDs (server-side) and wait until they are established.

    A CRD whose conversion webhook a loopback webhook already points at a `url` keeps that
    clientConfig: the file's `service` beside it would be refused (one of url or service).
    """
    with tempfile.TemporaryDirectory() as tmp:
        source = _keeping_webhook_urls(kubeconfig, crd_dir, Path(tmp))
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(source))
        kubectl(
            kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(source)
        )


def _keeping_webhook_urls(kubeconfig: str | Path, crd_dir: Path, tmp: Path) -> Path:
    import yaml

    listed = run_kubectl(kubeconfig, "get", "crd", "-o", "json")
    live = {
        crd["metadata"]["name"]: crd
        for crd in (json.loads(listed.stdout)["items"] if listed.returncode == 0 else [])
    }
    changed = False
    for path in sorted(crd_dir.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        found = live.get(doc["metadata"]["name"]) or {}
        config = (((found.get("spec") or {}).get("conversion") or {}).get("webhook") or {}).get(
            "clientConfig"
        ) or {}
        wanted = (doc["spec"].get("conversion") or {}).get("webhook")
        if config.get("url") and wanted is not None:
            wanted["clientConfig"] = config
            changed = True
        (tmp / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp if changed else crd_dir


def crd_names() -> list[str]:
    """The names of the CRDs in crds/ (`queues.cloud.provisioner.dev`, ...)."""
    import yaml

    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


def cluster_answers(kubeconfig: str | Path) -> str:
    """ "" when the cluster in `kubeconfig` is ready, else why not (one line)."""
    try:
        result = run_kubectl(kubeconfig, "get", "--raw", "/readyz", timeout=15)
    except subprocess.TimeoutExpired:
        return "it did not answer within 15 s"
    if result.returncode == 0:
        return ""
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"kubectl exited with {result.returncode}"


def cluster_server(kubeconfig: str | Path) -> str:
    result = run_kubectl(
        kubeconfig, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    )
    return result.stdout.strip() if result.returncode == 0 else "?"


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
            lambda: _http_up(f"{self.url}/healthz"),
            what="operator",
            timeout=timeout,
            env=env,
        )

    def stop(self, kill: bool = False, timeout: float = 15.0) -> None:
        super().stop(kill=kill, timeout=timeout)


# A v1alpha1 object the API server must convert to store (v1beta1): only a dry run, to see
# the conversion webhook answer.
_PROBE = """apiVersion: cloud.provisioner.dev/v1alpha1
kind: Topic
metadata:
  name: conversion-probe
  namespace: default
spec:
  writeConnectionSecretToRef:
    name: conversion-probe
"""


def conversion_answers(kubeconfig: str | Path) -> bool:
    """Whether the API server converts v1alpha1 through the webhook now, and lists every
    kind again (pointing the CRDs at the webhook updates them, and the API server answers
    429 "storage is (re)initializing" to lists for a moment after a CRD update)."""
    done = run_kubectl(
        kubeconfig, "create", "--dry-run=server", "-o", "name", "-f", "-", input=_PROBE
    )
    if done.returncode != 0:
        return False
    kinds = ",".join(f"{plural}.cloud.provisioner.dev" for plural in _PLURALS)
    return run_kubectl(kubeconfig, "get", kinds, "-A", "-o", "name").returncode == 0


_PLURALS = ("databaseinstances", "s3buckets", "queues", "topics")


@dataclass(kw_only=True)
class WebhookProcess(LoopbackService):
    """`provisioner webhook`: the CRDs' conversion webhook on loopback, apart from the
    operators, so that v1alpha1 objects can be written while an operator restarts."""

    kubeconfig: str

    def start(self, timeout: float = 60.0) -> None:
        self.port = self.port or fixed_port()
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, PROVISIONER_NAMESPACE="default")
        self.launch(
            [sys.executable, "-m", "provisioner", "webhook", f"--webhook-port={self.port}"],
            lambda: conversion_answers(self.kubeconfig),
            what="conversion webhook",
            timeout=timeout,
            env=env,
        )


# The processes of a dev environment, by the part they play. The control plane and moto
# hold its data (CRs, Secrets, cloud resources): when one of them dies that data is gone and
# `dev up` starts over. The operator holds none: `dev up` restarts it alone.
CONTROLLER_MANAGER = "kube-controller-manager"
CONTROL_PLANE = ("etcd", "kube-apiserver", CONTROLLER_MANAGER)
MOTO = "moto"
# The aws-like profile's proxy in front of moto: it holds the cloud's timing (what is still
# `creating`, which names are held), so it counts like moto.
PROXY = "awslike-proxy"
OPERATOR = "operator"
STATE_VERSION = 2


def _part(name: str) -> str:
    return "control plane" if name in CONTROL_PLANE else name


def _record(name: str, pid: int, log: Path) -> dict:
    return {"pid": pid, "start_time": start_time(pid), "part": _part(name), "log": str(log)}


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _note(message: str) -> None:
    print(f"provisioner: {message}", file=sys.stderr)


def _remove_secrets(kubeconfig: str, owners: set[str]) -> None:
    """The connection Secrets of `owners` (uids): the garbage collector cannot resolve an
    owner whose kind is gone, so it would keep them once the CRDs are deleted."""
    found = run_kubectl(
        kubeconfig, "get", "secrets", "-A", "-l", "app.kubernetes.io/managed-by=provisioner",
        "-o", "json",
    )  # fmt: skip
    secrets = json.loads(found.stdout).get("items", []) if found.returncode == 0 else []
    for secret in secrets:
        meta = secret["metadata"]
        if {ref.get("uid") for ref in meta.get("ownerReferences") or []} & owners:
            run_kubectl(
                kubeconfig, "delete", "secret", meta["name"], "-n", meta["namespace"],
                "--ignore-not-found",
            )  # fmt: skip


class DevStack:
    """The state behind `provisioner dev up/status/down`, kept in `.dev/`.

    `state.json` names every process it started (pid, start time, part it plays, log),
    so that `dev up` can tell a dead operator (restart it, keep the rest) from a dead
    control plane or moto (start over), and never mistakes a reused pid for ours.
    """

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir
        self.state_file = dev_dir / "state.json"

    def load(self) -> dict | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        if "processes" not in state:  # written before processes were recorded by part
            state["processes"] = {
                name: {"pid": pid, "start_time": None, "part": _part(name)}
                for name, pid in state.get("pids", {}).items()
            }
            state["with_operator"] = OPERATOR in state["processes"]
        return state

    def save(self, state: dict) -> None:
        state["pids"] = {name: proc["pid"] for name, proc in state["processes"].items()}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    @staticmethod
    def is_alive(proc: dict) -> bool:
        return same_alive(proc["pid"], proc.get("start_time"))

    def dead(self, state: dict, wait: float = 0.0) -> list[str]:
        """What is wrong with the control plane and moto: empty when both run and answer.

        A live API server or moto that does not answer is given up to `wait` seconds.
        """
        processes = state.get("processes", {})
        if state.get("external_cluster"):
            return self._dead_external(state, wait)
        # A control plane from envtest's binaries runs without a controller-manager.
        needed = [n for n in CONTROL_PLANE if n != CONTROLLER_MANAGER or state.get("gc", True)]
        missing = [name for name in (*needed, MOTO) if name not in processes]
        if missing or "controlplane" not in state or "moto_url" not in state:
            return [f"{self.state_file} is incomplete ({_join(missing or ['URLs'])} missing)"]
        if gone := self._dead_holders(processes):
            return gone
        cp = ControlPlaneState(**state["controlplane"])
        probes = {
            "kube-apiserver": lambda: healthy(cp),
            MOTO: lambda: _http_up(f"{state['moto_url']}/moto-api/"),
        }
        problems = []
        for name, probe in probes.items():
            try:
                wait_until(probe, timeout=wait, what=name)
            except StartError:
                problems.append(f"{name} does not answer")
        return problems

    def _dead_holders(self, processes: dict) -> list[str]:
        """The processes that hold data (all but the operator) that are dead, in one line."""
        gone = [
            name
            for name, proc in processes.items()
            if proc["part"] != OPERATOR and not self.is_alive(proc)
        ]
        return [f"{_join(gone)} {'is' if len(gone) == 1 else 'are'} dead"] if gone else []

    def _dead_external(self, state: dict, wait: float) -> list[str]:
        """An existing cluster (`dev up --kubeconfig`): it answers, and moto runs."""
        processes = state.get("processes", {})
        if MOTO not in processes or "moto_url" not in state:
            return [f"{self.state_file} is incomplete (moto missing)"]
        if gone := self._dead_holders(processes):
            return gone
        problems = []
        why = cluster_answers(state["kubeconfig"])
        if why:
            problems.append(f"the cluster in {state['kubeconfig']} does not answer ({why})")
        try:
            wait_until(lambda: _http_up(f"{state['moto_url']}/moto-api/"), timeout=wait, what=MOTO)
        except StartError:
            problems.append(f"{MOTO} does not answer")
        return problems

    def operator(self, state: dict) -> str:
        """'running', 'dead', or 'not started' (--no-operator)."""
        proc = state["processes"].get(OPERATOR)
        if proc is None:
            return "not started"
        return "running" if self.is_alive(proc) else "dead"

    def running(self, state: dict) -> bool:
        return not self.dead(state)

    def clean(self, state: dict | None) -> None:
        if state and state.get("external_cluster"):
            self._remove_from_cluster(state)
        if state:
            for proc in reversed(list(state.get("processes", {}).values())):
                if self.is_alive(proc):
                    stop(proc["pid"], timeout=15.0 if proc["part"] == OPERATOR else 10.0)
            shutil.rmtree(state.get("data_dir", ""), ignore_errors=True)
        for name in ("state.json", "env", "kubeconfig"):
            (self.dev_dir / name).unlink(missing_ok=True)

    def _remove_from_cluster(self, state: dict) -> None:
        """Take out of an existing cluster exactly what `dev up --kubeconfig` put there: the
        CRDs it installed, and with them every custom resource of theirs (the connection
        Secrets go with their owners, by the cluster's garbage collector). The operator is
        stopped first; our finalizer is taken off what is left, since the cloud (this dev
        environment's moto) goes away too. Nothing else in the cluster is touched."""
        kubeconfig = state["kubeconfig"]
        operator = state.get("processes", {}).get(OPERATOR)
        if operator and self.is_alive(operator):
            stop(operator["pid"], timeout=15.0)
        installed = state.get("installed_crds") or []
        if not installed or cluster_answers(kubeconfig):
            return
        from provisioner import FINALIZER

        owners: set[str] = set()
        for crd in installed:
            found = run_kubectl(kubeconfig, "get", crd, "-A", "-o", "json")
            items = json.loads(found.stdout).get("items", []) if found.returncode == 0 else []
            for item in items:
                meta = item["metadata"]
                owners.add(meta["uid"])
                finalizers = meta.get("finalizers") or []
                if FINALIZER not in finalizers:
                    continue
                index = finalizers.index(FINALIZER)
                run_kubectl(
                    kubeconfig,
                    "patch",
                    crd,
                    meta["name"],
                    "-n",
                    meta["namespace"],
                    "--type=json",
                    f'-p=[{{"op":"test","path":"/metadata/finalizers/{index}",'
                    f'"value":"{FINALIZER}"}},'
                    f'{{"op":"remove","path":"/metadata/finalizers/{index}"}}]',
                )
            run_kubectl(kubeconfig, "delete", crd, "--all", "-A", "--timeout=60s")
        _remove_secrets(kubeconfig, owners)
        run_kubectl(kubeconfig, "delete", "crd", *installed, "--ignore-not-found", "--timeout=120s")
        # The chart's policies and roles it applied (cluster-scoped, named provisioner-dev-*).
        from provisioner_dev import admission

        admission.remove(kubeconfig, state)

    def up(
        self,
        with_operator: bool = True,
        cloud: CloudProfile | None = None,
        kubeconfig: Path | None = None,
    ) -> dict:
        """Start what is not running; keep the control plane and moto when they run.

        `cloud` is the aws-like profile (None: moto as it is); a running environment keeps
        the profile it was started with (`dev up` refuses another one before calling this).
        """
        state = self.load()
        if state:
            problems = self.dead(state, wait=10.0)
            if not problems:
                return self._keep(state, with_operator)
            _note(
                f"{'; '.join(problems)}: stopping the rest of the old dev environment and "
                "starting over (its CRs, Secrets and cloud resources are gone)"
            )
        self.clean(state)
        if kubeconfig is not None:
            return self._start_external(kubeconfig, with_operator, cloud)
        return self._start(with_operator, cloud)

    def _start_external(
        self, kubeconfig: Path, with_operator: bool, cloud: CloudProfile | None
    ) -> dict:
        """An existing cluster: its CRDs installed, moto and the operator run here."""
        kubeconfig = kubeconfig.resolve()
        if not kubeconfig.is_file():
            raise RuntimeError(f"no kubeconfig at {kubeconfig}")
        why = cluster_answers(kubeconfig)
        if why:
            raise RuntimeError(f"cannot reach the cluster in {kubeconfig}: {why}")
        wanted = crd_names()
        listed = run_kubectl(kubeconfig, "get", "crd", "-o", "name")
        if listed.returncode != 0:
            raise RuntimeError(f"cannot list CRDs in {kubeconfig}: {listed.stderr.strip()}")
        present = sorted(set(wanted) & {line.split("/", 1)[-1] for line in listed.stdout.split()})
        if present:
            raise RuntimeError(
                f"the cluster in {kubeconfig} already has {', '.join(present)}: another "
                "installation may be acting on them; `dev up --kubeconfig` uses a cluster "
                "without them, so that it never acts on custom resources it did not create"
            )
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="provisioner-dev-"))
        started = time.monotonic()
        moto = MotoServer(log=self.dev_dir / "moto.log")
        proxy: AwsLikeProxy | None = None
        state: dict = {}
        try:
            moto.start()
            assert moto.proc is not None
            processes = {MOTO: _record(MOTO, moto.proc.pid, moto.log)}
            proxy, endpoint = self._start_proxy(moto.url, cloud, processes)
            state = {
                "version": STATE_VERSION,
                "data_dir": str(data_dir),
                "external_cluster": cluster_server(kubeconfig),
                "kubeconfig": str(kubeconfig),
                "installed_crds": wanted,
                "moto_url": moto.url,
                "cloud_profile": cloud.name if cloud else "instant",
                "cloud_url": endpoint,
                "with_operator": with_operator,
                "processes": processes,
            }
            install_crds(kubeconfig)
            self._as_installed(state)
            if with_operator:
                self._start_operator(state)
        except BaseException:
            if state:
                self._remove_from_cluster(state)
            if proxy is not None:
                proxy.stop()
            moto.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        state["started_in_seconds"] = round(time.monotonic() - started, 2)
        self.save(state)
        self._write_env(state)
        return state

    def _start_proxy(
        self, moto_url: str, cloud: CloudProfile | None, processes: dict
    ) -> tuple[AwsLikeProxy | None, str]:
        """The aws-like profile's proxy in front of moto (recorded in `processes`), and the
        endpoint the operator and `.dev/env` use: the proxy's, or moto's without a profile."""
        if cloud is None:
            return None, moto_url
        log = self.dev_dir / "awslike.log"
        proxy = AwsLikeProxy(upstream=moto_url, profile=cloud.name, args=cloud.args, log=log)
        proxy.start()
        assert proxy.proc is not None
        processes[PROXY] = _record(PROXY, proxy.proc.pid, log)
        return proxy, proxy.url

    def _start(self, with_operator: bool, cloud: CloudProfile | None) -> dict:
        from provisioner_dev.launch import Stack

        self.dev_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="provisioner-dev-"))
        started = time.monotonic()
        stack = Stack(dir=data_dir, log_dir=self.dev_dir, serve_webhook=False)
        kubeconfig = self.dev_dir / "kubeconfig"
        proxy: AwsLikeProxy | None = None
        try:
            stack.start()
            shutil.copy(stack.kubeconfig, kubeconfig)
            kubeconfig.chmod(0o600)
            cp = stack.controlplane
            cp_state = cp.state()
            processes = {
                name: _record(name, pid, cp.logs / f"{name}.log")
                for name, pid in cp_state.pids.items()
            }
            assert stack.cloud.proc is not None
            processes[MOTO] = _record(MOTO, stack.cloud.proc.pid, stack.cloud.log)
            proxy, endpoint = self._start_proxy(stack.cloud.url, cloud, processes)
            state = {
                "version": STATE_VERSION,
                "data_dir": str(data_dir),
                "controlplane": cp_state.to_json(),
                "kubeconfig": str(kubeconfig),
                "moto_url": stack.cloud.url,
                "cloud_profile": cloud.name if cloud else "instant",
                "cloud_url": endpoint,
                "with_operator": with_operator,
                "processes": processes,
                "gc": CONTROLLER_MANAGER in processes,
            }
            self._as_installed(state)
            if with_operator:
                self._start_operator(state)
        except BaseException:
            if proxy is not None:
                proxy.stop()
            stack.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        state["started_in_seconds"] = round(time.monotonic() - started, 2)
        self.save(state)
        self._write_env(state)
        return state

    def _keep(self, state: dict, with_operator: bool) -> dict:
        """The control plane and moto run: start or stop only the operator."""
        proc = state["processes"].get(OPERATOR)
        operator = self.operator(state)
        if with_operator and operator == "running":
            _note("already running; nothing to start")
        elif with_operator:
            what = (
                f"the operator (pid {proc['pid']}) is dead; starting it again"
                if operator == "dead"
                else "starting the operator"
            )
            _note(f"{what}; the control plane and moto keep running (same ports, same .dev/env)")
            state["processes"].pop(OPERATOR, None)
            self.save(state)
            self._start_operator(state)
        elif operator == "running":
            stop(proc["pid"], timeout=15.0)
            state["processes"].pop(OPERATOR)
            _note(
                f"stopped the operator (pid {proc['pid']}) that an earlier `dev up` started, "
                "so that you can run your own: source .dev/env && provisioner run"
            )
        else:
            state["processes"].pop(OPERATOR, None)
            _note("already running, without an operator (--no-operator); nothing to start")
        state["with_operator"] = with_operator
        self.save(state)
        self._write_env(state)
        return state

    @staticmethod
    def _as_installed(state: dict) -> None:
        """What the chart installs around the operator: its admission policies and roles,
        and spec.access through IRSA (provisioner_dev/admission.py)."""
        from provisioner_dev import admission

        admission.set_up(state, state["kubeconfig"])

    def _start_operator(self, state: dict) -> None:
        from provisioner_dev import admission

        # It serves the CRDs' conversion webhook itself, on loopback, and runs as the chart
        # runs it (requested-by verified, spec.access with IRSA).
        operator = OperatorProcess(
            kubeconfig=state["kubeconfig"],
            endpoint_url=state.get("cloud_url", state["moto_url"]),
            log=self.dev_dir / "operator.log",
            extra_args=[f"--webhook-port={fixed_port()}", *admission.operator_args(state)],
        )
        try:
            operator.start()
        except BaseException:
            operator.stop()
            raise
        assert operator.proc is not None
        state["processes"][OPERATOR] = _record(OPERATOR, operator.proc.pid, operator.log)

    def _write_env(self, state: dict) -> None:
        """`.dev/env` and `.dev/kubeconfig`: the same bytes as long as the control plane lives."""
        from provisioner_dev import admission

        kubeconfig = Path(state["kubeconfig"])
        if not kubeconfig.exists():
            shutil.copy(state["controlplane"]["kubeconfig"], kubeconfig)
            kubeconfig.chmod(0o600)
        env_lines = {
            "KUBECONFIG": str(kubeconfig.resolve()),
            **aws_env(state.get("cloud_url", state["moto_url"])),
            "PROVISIONER_CLUSTER_ID": DEV_CLUSTER_ID,
            **admission.operator_env(state),
        }
        text = "".join(f"export {k}={v}\n" for k, v in env_lines.items())
        env = self.dev_dir / "env"
        if not env.exists() or env.read_text() != text:
            env.write_text(text)

    def down(self) -> bool:
        state = self.load()
        self.clean(state)
        return state is not None
