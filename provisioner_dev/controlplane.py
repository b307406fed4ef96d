"""A real, loopback-only Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager.

Everything lives in one directory (certificates, etcd data, logs, kubeconfig); free
ports are picked at start so that two copies can run side by side.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from provisioner_dev import pki as pki_mod
from provisioner_dev.kubectl import run_kubectl
from provisioner_dev.processes import (
    StartError,
    fixed_port,
    free_port,
    spawn,
    stop,
    wait_port_released,
    wait_until,
)

CONTEXT = "provisioner-dev"
# With nodes (provisioner_dev/node.py): the node's bridge address, where pods reach the API
# server (it is the `kubernetes` Service's endpoint).
NODE_GATEWAY = "10.244.0.1"


@dataclass
class ControlPlaneState:
    dir: str
    kubeconfig: str
    apiserver_url: str
    etcd_url: str
    pids: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _ssl_context(p: pki_mod.Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca_cert))
    ctx.load_cert_chain(str(p.cert("admin")), str(p.key("admin")))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:  # noqa: S310
        return resp.status, resp.read().decode(errors="replace")


def write_kubeconfig(
    path: Path,
    server: str,
    p: pki_mod.Pki,
    user: str = "admin",
    *,
    token: str | None = None,
    namespace: str | None = None,
) -> None:
    """A kubeconfig for `user`: its client certificate, or a bearer token when given."""

    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    credentials = (
        {"token": token}
        if token
        else {"client-certificate-data": b64(p.cert(user)), "client-key-data": b64(p.key(user))}
    )
    endpoint = Endpoint(server, b64(p.ca_cert))
    _write(path, endpoint.cluster(), user, credentials, namespace)


def write_token_kubeconfig(
    path: Path, endpoint: Endpoint, user: str, token: str, namespace: str | None = None
) -> None:
    """A kubeconfig with only a bearer token, for any cluster's `endpoint`."""
    _write(path, endpoint.cluster(), user, {"token": token}, namespace)


def _write(path: Path, cluster: dict, user: str, credentials: dict, namespace: str | None) -> None:
    context = {"cluster": CONTEXT, "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": CONTEXT, "context": context}],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


@dataclass(frozen=True)
class Endpoint:
    """Where a cluster's API server is and how to trust it (a CA, base64, or "": no check)."""

    server: str
    ca_data: str

    def cluster(self) -> dict[str, object]:
        if not self.ca_data:
            return {"server": self.server, "insecure-skip-tls-verify": True}
        return {"server": self.server, "certificate-authority-data": self.ca_data}

    def write_ca(self, path: Path) -> Path | None:
        """The CA as a PEM file (for `kubectl --certificate-authority`), or None (no check)."""
        if not self.ca_data:
            return None
        path.write_bytes(base64.b64decode(self.ca_data))
        return path


def endpoint_of(kubeconfig: str | Path) -> Endpoint:
    """The current context's API server and CA in `kubeconfig` (files or inline data)."""
    result = run_kubectl(kubeconfig, "config", "view", "--minify", "--raw", "-o", "json")
    if result.returncode != 0:
        raise RuntimeError(f"cannot read {kubeconfig}: {result.stderr.strip()}")
    cluster = json.loads(result.stdout)["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data", "")
    if not ca and cluster.get("certificate-authority"):
        ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    return Endpoint(cluster["server"], ca)


class ControlPlane:
    def __init__(self, directory: Path, binaries: dict[str, Path], *, nodes: bool = False) -> None:
        """`nodes`: ready for a node's pods: the API server also listens on the node's
        bridge and is the `kubernetes` Service's endpoint there, pods get ServiceAccount
        tokens, and the controller manager runs Deployments, Services and disruption budgets."""
        self.dir = directory
        self.bin = binaries
        self.nodes = nodes
        self.pki = pki_mod.Pki(directory / "pki")
        self.logs = directory / "logs"
        self.kubeconfig = directory / "kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.etcd_port = 0
        self.apiserver_port = 0

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.apiserver_url, base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        )

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def start(self, timeout: float = 60.0) -> ControlPlaneState:
        self.dir.mkdir(parents=True, exist_ok=True)
        pki_mod.generate(self.pki.dir)
        try:
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            write_kubeconfig(self.kubeconfig, self.apiserver_url, self.pki)
            if "kube-controller-manager" in self.bin:  # envtest's binaries have none
                self._start_controller_manager(timeout)
        except BaseException:
            self.stop()
            raise
        return self.state()

    def state(self) -> ControlPlaneState:
        return ControlPlaneState(
            dir=str(self.dir),
            kubeconfig=str(self.kubeconfig),
            apiserver_url=self.apiserver_url,
            etcd_url=self.etcd_url,
            pids={name: proc.pid for name, proc in self.procs.items()},
        )

    def _start_etcd(self, timeout: float) -> None:
        self.etcd_port, peer_port = free_port(), free_port()
        log = self.logs / "etcd.log"
        peer = f"http://127.0.0.1:{peer_port}"
        self.procs["etcd"] = proc = spawn(
            [
                str(self.bin["etcd"]),
                "--name=default",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
                "--auto-compaction-retention=5m",
                "--auto-compaction-mode=periodic",
            ],
            log,
        )
        wait_until(
            lambda: '"health":"true"' in _get(f"{self.etcd_url}/health")[1].replace(" ", ""),
            timeout=timeout,
            what="etcd",
            proc=proc,
            log=log,
        )

    def _start_apiserver(self, timeout: float, port: int | None = None) -> None:
        # Kept across `restart_apiserver()`: outside the ephemeral range.
        self.apiserver_port = port or fixed_port()
        log = self.logs / "kube-apiserver.log"
        p = self.pki
        self.procs["kube-apiserver"] = proc = spawn(
            [
                str(self.bin["kube-apiserver"]),
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
                f"--secure-port={self.apiserver_port}",
                # Restarted on the same port: what the last one's connections left in
                # TIME_WAIT must not keep it from listening.
                "--permit-address-sharing=true",
                *(
                    ["--bind-address=0.0.0.0", f"--advertise-address={NODE_GATEWAY}"]
                    if self.nodes
                    else [
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                        "--endpoint-reconciler-type=none",
                    ]
                ),
                f"--tls-cert-file={p.cert('apiserver')}",
                f"--tls-private-key-file={p.key('apiserver')}",
                f"--client-ca-file={p.ca_cert}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                *([] if self.nodes else ["--disable-admission-plugins=ServiceAccount"]),
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--api-audiences=https://kubernetes.default.svc",
                "--profiling=false",
                "--event-ttl=1h",
                "--v=0",
            ],
            log,
        )
        ctx = _ssl_context(p)
        wait_until(
            lambda: _get(f"{self.apiserver_url}/readyz", ctx)[0] == 200,
            timeout=timeout,
            what="kube-apiserver",
            proc=proc,
            log=log,
        )

    def _start_controller_manager(self, timeout: float) -> None:
        kubeconfig = self.dir / "controller-manager.kubeconfig"
        write_kubeconfig(kubeconfig, self.apiserver_url, self.pki, user="controller-manager")
        log = self.logs / "kube-controller-manager.log"
        health_port = free_port()
        self.procs["kube-controller-manager"] = proc = spawn(
            [
                str(self.bin["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # Owner references, namespaces, default ServiceAccounts; the standard roles'
                # aggregation (the chart's view/edit rules) and ResourceQuota usage.
                "--controllers=garbage-collector-controller,namespace-controller,"
                "serviceaccount-controller,clusterrole-aggregation-controller,"
                "resourcequota-controller"
                + (
                    ",deployment-controller,replicaset-controller,endpointslice-controller,"
                    "root-ca-certificate-publisher-controller,disruption-controller,"
                    "node-lifecycle-controller"
                    if self.nodes
                    else ""
                ),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={health_port}",
                f"--cert-dir={self.dir / 'kcm-certs'}",
                "--concurrent-gc-syncs=20",
                "--concurrent-namespace-syncs=10",
                # A quota on a custom kind is counted once the controller has discovered the
                # kind (every 30 s) and resyncs the quota: every 5 s here, not 5 minutes.
                "--resource-quota-sync-period=5s",
                "--v=0",
            ],
            log,
        )
        # The controller manager serves /healthz to anyone (system:public-info-viewer).
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        wait_until(
            lambda: _get(f"https://127.0.0.1:{health_port}/healthz", insecure)[0] == 200,
            timeout=timeout,
            what="kube-controller-manager",
            proc=proc,
            log=log,
        )

    def restart_apiserver(self, timeout: float = 60.0) -> None:
        """Stop and start kube-apiserver on the same port (for fault tests)."""
        proc = self.procs.pop("kube-apiserver", None)
        if proc is not None:
            stop(proc.pid)
        wait_port_released(self.apiserver_port)
        self._start_apiserver(timeout, port=self.apiserver_port)

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc.pid)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass


def healthy(state: ControlPlaneState) -> bool:
    p = pki_mod.Pki(Path(state.dir) / "pki")
    try:
        return _get(f"{state.apiserver_url}/readyz", _ssl_context(p))[0] == 200
    except Exception:  # noqa: BLE001 - any failure means unhealthy
        return False


__all__ = ["ControlPlane", "ControlPlaneState", "StartError", "healthy", "write_kubeconfig"]
