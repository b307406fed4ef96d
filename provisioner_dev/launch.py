"""One starter for the whole local stack, used by `provisioner dev up`, the tests and bench/.

A `Stack` is a control plane, a cloud endpoint (moto's server, or LocalStack), the CRDs,
optionally the aws-like proxy in front of moto (`cloud_profile`) and a fault proxy in front of
that, and operator processes, all children of this process with their data in one directory.
The operators' calls go operator -> fault proxy -> aws-like proxy -> moto (each part only when
asked for): the fault proxy's "lost" answers then come after the aws-like proxy has seen the
call, as AWS would have (its states and buckets move), and only calls that got through the
fault proxy draw from the throttling buckets.

    with Stack(dir=workdir, record=True) as stack:   # start() ... stop()
        stack.start_operator(args=["--resync-seconds=4"], cluster_id="bench")
        ...

`start()` stops what it started when a part fails; `stop()` stops every part, whatever
happened, and never removes the directory (the caller decides whether to keep it: `remove()`).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml

from provisioner_dev.awsenv import aws_env
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.binaries import ensure_binaries
from provisioner_dev.cloudprofile import CloudProfile
from provisioner_dev.controlplane import (
    ControlPlane,
    Endpoint,
    endpoint_of,
    write_token_kubeconfig,
)
from provisioner_dev.crds import install_crds
from provisioner_dev.kubectl import cluster_answers, kubectl, run_kubectl
from provisioner_dev.processes import fixed_port
from provisioner_dev.services import FaultProxy, MotoServer, OperatorProcess, WebhookProcess

if TYPE_CHECKING:
    from provisioner_dev.localstack import LocalStackServer

# Where a ServiceAccount made by `service_account_kubeconfig` lives.
SERVICE_ACCOUNT_NAMESPACE = "provisioner-dev"


@dataclass(kw_only=True)
class Stack:
    dir: Path
    # Logs of the cloud, the proxy and the operators (default: `dir`).
    log_dir: Path | None = None
    cloud_kind: str = "moto"  # or "localstack"
    # moto's request recorder on, writing to `recording` (one JSON line per request);
    # LocalStack has none.
    record: bool = False
    # A fault proxy in front of the cloud, failing this share of calls; operators use it.
    fault_rate: float | None = None
    fault_seed: int | None = None
    # The aws-like profile (provisioner_dev/awslike.py) between the operators and moto.
    cloud_profile: CloudProfile | None = None
    cloud_seed: int | None = None
    # A cluster that already runs (its kubeconfig): no control plane is started or built;
    # the CRDs are applied to it, and what `service_account_kubeconfig` adds there is removed
    # again by `stop()`.
    existing: Path | None = None
    # `provisioner webhook` as a process of its own (stopped by `stop()`); off: the operators
    # must serve the conversion webhook (--webhook=on), or v1alpha1 cannot be written.
    serve_webhook: bool = True
    # The CRDs applied at start (another release's, to test an upgrade).
    crd_dir: Path | None = None

    controlplane: ControlPlane = field(init=False)
    cloud: MotoServer | LocalStackServer = field(init=False)
    proxy: FaultProxy | None = field(init=False, default=None)
    awslike: AwsLikeProxy | None = field(init=False, default=None)
    # The CRDs' conversion webhook, apart from the operators (they run with --webhook=off).
    webhook: WebhookProcess | None = field(init=False, default=None)
    operators: list[OperatorProcess] = field(init=False, default_factory=list)
    _added: list[tuple[str, str]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        logs = self.log_dir or self.dir
        # The binaries are found (or built) by start().
        self.controlplane = ControlPlane(self.dir / "controlplane", {})
        if self.cloud_kind == "localstack":
            from provisioner_dev.localstack import LocalStackServer

            self.cloud = LocalStackServer(
                log=logs / "localstack.log", data_dir=self.dir / "localstack"
            )
        elif self.cloud_kind == "moto":
            self.cloud = MotoServer(log=logs / "moto.log", record_to=self.recording)
        else:
            raise ValueError(f"unknown cloud {self.cloud_kind!r}: moto or localstack")
        if self.cloud_profile is not None and self.cloud_kind != "moto":
            raise ValueError("a cloud profile plays AWS in front of moto, not LocalStack")

    # -- the parts ---------------------------------------------------------------------------

    @property
    def recording(self) -> Path | None:
        if not self.record or self.cloud_kind != "moto":
            return None
        return self.dir / "moto-requests.jsonl"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig: the control plane's (client certificate), or the existing
        cluster's as given."""
        return self.existing or self.controlplane.kubeconfig

    @property
    def endpoint(self) -> Endpoint:
        """The API server's address and CA, for kubeconfigs with a token of their own."""
        if self.existing is not None:
            return endpoint_of(self.existing)
        return self.controlplane.endpoint

    @property
    def has_controller_manager(self) -> bool:
        """Garbage collection, role aggregation and quotas run: a real cluster has them; the
        control plane started here lacks them on envtest's binaries."""
        return self.existing is not None or "kube-controller-manager" in self.controlplane.procs

    @property
    def operator(self) -> OperatorProcess | None:
        """The operator started last."""
        return self.operators[-1] if self.operators else None

    @property
    def cloud_url(self) -> str:
        """The cloud as the operators see it, faults aside: the aws-like proxy, else moto."""
        return self.awslike.url if self.awslike is not None else self.cloud.url

    @property
    def operator_url(self) -> str:
        """The cloud endpoint the operators are given: the fault proxy's when there is one."""
        return self.proxy.url if self.proxy is not None else self.cloud_url

    def start(self) -> Stack:
        if self.existing is not None:
            why = cluster_answers(self.existing)
            if why:
                raise RuntimeError(f"the cluster in {self.existing} is not ready: {why}")
        else:
            self.controlplane.bin = ensure_binaries()
        try:
            if self.existing is None:
                self.controlplane.start()
            self.cloud.start()
            install_crds(self.kubeconfig, *([self.crd_dir] if self.crd_dir else []))
            if self.serve_webhook:
                self.webhook = WebhookProcess(
                    log=(self.log_dir or self.dir) / "webhook.log",
                    kubeconfig=str(self.kubeconfig),
                    metrics_port=fixed_port(),
                )
                self.webhook.start()
                if self.existing is not None:
                    self._added.append(("secret", "provisioner-webhook-tls"))
            if self.cloud_profile is not None:
                self.awslike = AwsLikeProxy(
                    upstream=self.cloud.url,
                    profile=self.cloud_profile.name,
                    args=self.cloud_profile.args,
                    seed=self.cloud_seed,
                    log=(self.log_dir or self.dir) / "awslike.log",
                )
                self.awslike.start()
            if self.fault_rate is not None:
                self.proxy = FaultProxy(
                    upstream=self.cloud_url,
                    log=(self.log_dir or self.dir) / "proxy.log",
                    rate=self.fault_rate,
                    seed=self.fault_seed,
                )
                self.proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def start_operator(
        self,
        *,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cluster_id: str | None = None,
        kubeconfig: str | Path | None = None,
        rbac_rules: list[dict[str, Any]] | None = None,
        log: Path | None = None,
        endpoint_url: str | None = None,
        timeout: float = 60.0,
        wait: bool = True,
        package_dir: Path | None = None,
    ) -> OperatorProcess:
        """An operator process (stopped by `stop()`), as the admin unless told otherwise.

        `rbac_rules`: as a new ServiceAccount holding exactly these rules, with a token
        kubeconfig (no client certificate); `kubeconfig`: with that one. `wait=False` only
        builds it: `start()` it yourself.
        """
        if rbac_rules is not None:
            kubeconfig = self.service_account_kubeconfig("provisioner-operator", rbac_rules)
        extra_env = dict(env or {})
        if cluster_id is not None:
            extra_env["PROVISIONER_CLUSTER_ID"] = cluster_id
        op = OperatorProcess(
            kubeconfig=str(kubeconfig or self.kubeconfig),
            endpoint_url=endpoint_url or self.operator_url,
            log=log or (self.log_dir or self.dir) / "operator.log",
            extra_args=list(args or [])
            + (
                []
                if not self.serve_webhook or any(a.startswith("--webhook") for a in args or [])
                else ["--webhook=off"]
            ),
            extra_env=extra_env,
            package_dir=package_dir,
        )
        self.operators.append(op)
        if wait:
            op.start(timeout=timeout)
        return op

    def service_account_kubeconfig(self, name: str, rules: list[dict[str, Any]]) -> str:
        """A kubeconfig for a new ServiceAccount holding exactly `rules`, cluster-wide.

        On an existing cluster, the names carry this stack's directory name, so that two runs
        (or a `dev up` there) never share them."""
        ns = SERVICE_ACCOUNT_NAMESPACE
        if self.existing is not None:
            run = hashlib.sha256(str(self.dir).encode()).hexdigest()[:6]
            ns, name = f"{ns}-{run}", f"{name}-{run}"
        docs = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": ns},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        ]
        kubectl(self.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
        self._added += [("clusterrolebinding", name), ("clusterrole", name), ("namespace", ns)]
        token = kubectl(
            self.kubeconfig, "create", "token", name, "-n", ns, "--duration=24h"
        ).strip()
        path = self.dir / f"{name}.kubeconfig"
        write_token_kubeconfig(path, self.endpoint, name, token)
        return str(path)

    def pids(self) -> dict[str, int]:
        """Every running part by name: etcd, kube-apiserver, ..., moto, proxy, operator."""
        found = {name: p.pid for name, p in self.controlplane.procs.items()}
        if self.cloud.proc is not None:
            found[self.cloud_kind] = self.cloud.proc.pid
        if self.awslike is not None and self.awslike.proc is not None:
            found["awslike"] = self.awslike.proc.pid
        if self.proxy is not None and self.proxy.proc is not None:
            found["proxy"] = self.proxy.proc.pid
        running = [op for op in self.operators if op.proc is not None]
        for i, op in enumerate(running):
            assert op.proc is not None
            found["operator" if i == 0 else f"operator-{i}"] = op.proc.pid
        return found

    def env(self, kubeconfig: str | Path | None = None) -> dict[str, str]:
        """KUBECONFIG and AWS_* for a shell or a client of this stack."""
        path = Path(kubeconfig or self.kubeconfig).resolve()
        return {"KUBECONFIG": str(path), **aws_env(self.cloud.url)}

    def write_env(self, path: Path, kubeconfig: str | Path | None = None) -> None:
        """`export` lines for `source`."""
        lines = self.env(kubeconfig).items()
        path.write_text("".join(f"export {k}={v}\n" for k, v in lines))

    def stop(self) -> list[str]:
        """Stop every part, the operators first. A part that fails to stop does not keep the
        rest running: the failures are printed to stderr and returned."""
        parts: list[Any] = [
            *reversed(self.operators),
            self.webhook,
            self.proxy,
            self.awslike,
            self.cloud,
            self.controlplane,
        ]
        failures = []
        if self.existing is not None:
            parts.remove(self.controlplane)
        for part in parts:
            if part is None:
                continue
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                failures.append(f"stopping {type(part).__name__} failed: {exc}")
                print(f"provisioner: {failures[-1]}", file=sys.stderr)
        if self.existing is not None:
            failures += self._remove_added()
        return failures

    def _remove_added(self) -> list[str]:
        """What this stack added to an existing cluster (bar the CRDs), taken out again."""
        failures = []
        for kind, name in dict.fromkeys(self._added):
            result = run_kubectl(
                self.existing or "", "delete", kind, name, "--ignore-not-found", "--wait=false"
            )
            if result.returncode != 0:
                failures.append(f"deleting {kind}/{name} failed: {result.stderr.strip()}")
        self._added.clear()
        return failures

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
