"""The Helm chart against the real control plane: lint, render, install, and least privilege.

Two releases are installed without CRDs (crds.install=false and --skip-crds: the session
already applied crds/ and kopf's peering CRDs, helm refuses to adopt CRDs it does not own, and
the session's conversion webhook must stay the one the CRDs point at; the chart's CRDs are
checked with a server-side dry run instead):

- `cluster_wide`: the default values (two replicas, so kopf peering), a ClusterRole;
- `namespaced`: watchNamespaces = [own-xxxx], a Role in own-xxxx only.

For each, a token of the chart's ServiceAccount is checked with `kubectl auth can-i` for
what the operator needs and for what it must not be able to do. Then the operator process
itself runs with nothing but the namespaced release's token and drives a bucket, two queues
(one a dead-letter target, so the operator GETs a Queue) and a database to Ready and back
to deleted: any permission missing from the chart fails that test, and its log must not
show a single 403. own-xxxx follows the suite's convention (tests/e2e/conftest.py): the
session's operator runs with --namespace=!own-* and leaves such namespaces alone.

The control plane has no kubelet, so the Deployment never gets pods; the chart's objects are
checked as objects. helm is built on first use (hack/helm, a few minutes once per machine).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from provisioner.kinds.registry import KINDS as REGISTERED
from provisioner_dev.binaries import cached_helm, ensure_binaries, ensure_helm
from provisioner_dev.controlplane import ControlPlane
from provisioner_dev.services import OperatorProcess
from tests.conftest import needs_own_controlplane
from tests.helpers import (
    Kubectl,
    apply,
    events,
    get,
    secret_data,
    wait_for,
    wait_gone,
    wait_ready,
)

# The first test builds helm when it is not cached yet (a few minutes on 2 cores): give that
# test room; with helm cached, the suite's usual 300 s applies.
# "[2026-12-01 11:06:52,403] logger [LEVEL ] message": the timestamp in front of each line.
LOG_PREFIX = re.compile(r"^\[[^\]]*\]")
REFUSED = re.compile(r"\b403\b|[Ff]orbidden")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300 if cached_helm() else 1200)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "provisioner"
GROUP = "cloud.provisioner.dev"
KINDS = tuple(k.plural for k in REGISTERED)
PEERING = "provisioner"
# The CRDs whose conversion webhook the operator keeps pointed at itself.
CONVERTED_CRDS = tuple(f"{kind}.{GROUP}" for kind in KINDS)


class Helm:
    def __init__(self, binary: Path, kubeconfig: str, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        # helm's cache, config and data stay in the test directory, not in ~.
        self.env = dict(
            os.environ,
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args, f"--kubeconfig={self.kubeconfig}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env=self.env,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str
    token: str
    watched: str | None = None  # the one watched namespace, for the namespaced release

    @property
    def webhook_secret(self) -> str:
        return f"{self.name}-provisioner-webhook-tls"


def suffix() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def helm(cluster) -> Helm:
    return Helm(ensure_helm(), cluster.kubeconfig, cluster.dir / "helm")


def install(kube, helm: Helm, name: str, namespace: str, *sets: str) -> Release:
    args = ["install", name, str(CHART), "--namespace", namespace, "--create-namespace"]
    args += ["--skip-crds", "--set", "crds.install=false", "--set", "aws.region=us-east-1"]
    for s in sets:
        args += ["--set", s]
    helm(*args)
    sa = f"{name}-provisioner"
    token = kube.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    return Release(name=name, namespace=namespace, service_account=sa, token=token)


def uninstall(kube, helm: Helm, release: Release) -> None:
    helm("uninstall", release.name, "--namespace", release.namespace, check=False)
    kube.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def peering_crds(kube) -> Path:
    """kopf's peering CRDs from the chart, applied for real: both releases run with peering
    (two replicas) and create peering objects. They stay installed: other tests apply the same
    file, and deleting a CRD they are about to use would race with them."""
    path = CHART / "crds" / "kopf-peering.yaml"
    kube.kubectl("apply", "-f", str(path))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(path))
    return path


@pytest.fixture(scope="module")
def baseline(kube) -> Iterator[str]:
    """A token of a ServiceAccount that nothing is bound to."""
    ns = f"nobody-{suffix()}"
    kube.kubectl("create", "namespace", ns)
    kube.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    yield kube.kubectl("create", "token", "nobody", "-n", ns, "--duration=1h").stdout.strip()
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def cluster_wide(kube, helm, peering_crds) -> Iterator[Release]:
    s = suffix()
    release = install(kube, helm, f"cw-{s}", f"prov-cw-{s}")
    yield release
    uninstall(kube, helm, release)


@pytest.fixture(scope="module")
def namespaced(kube, helm, peering_crds) -> Iterator[Release]:
    s = suffix()
    own = f"own-{s}"
    kube.kubectl("create", "namespace", own)
    release = install(
        kube,
        helm,
        f"ns-{s}",
        f"prov-ns-{s}",
        f"watchNamespaces={{{own}}}",
        f"clusterId={own}",
    )
    release.watched = own
    yield release
    uninstall(kube, helm, release)
    kube.kubectl("delete", "namespace", own, "--wait=false", check=False)


def can(kube, release: Release, verb: str, resource: str, *scope: str) -> bool:
    """`kubectl auth can-i` as the release's ServiceAccount: True for yes, False for no."""
    result = kube.kubectl_as(release.token, "auth", "can-i", verb, resource, *scope)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource} {scope}: {result.stderr.strip()}"
    return answer == "yes"


def rules_of(kube, token: str, namespace: str) -> set[tuple[str, str, str]]:
    """(resource, resourceName, verb) a token may use in `namespace`: a SelfSubjectRulesReview."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    out = kube.kubectl_as(
        token, "create", "--validate=false", "-o", "json", "-f", "-", input=json.dumps(review)
    )
    assert out.returncode == 0, f"SelfSubjectRulesReview failed: {out.stderr.strip()}"
    status = json.loads(out.stdout)["status"]
    assert not status.get("incomplete"), status
    found = set()
    for rule in status["resourceRules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        found.add((f"{resource}.{group}".rstrip("."), name, verb))
    return found


def granted(kube, release: Release, baseline: str, namespace: str) -> set[tuple[str, str, str]]:
    """What the release's token may do in `namespace` beyond what any authenticated user may
    (the baseline: a ServiceAccount bound to nothing; self-reviews, ClusterTrustBundles...)."""
    nobody = rules_of(kube, baseline, namespace)
    mine = rules_of(kube, release.token, namespace)
    assert nobody <= mine
    return mine - nobody


# The conversion webhook: every operator reads and patches its own CRDs (by name), and keeps
# its certificate in one Secret of its own namespace (by name; `create` cannot be limited so).
CRD_RULES = {
    ("customresourcedefinitions.apiextensions.k8s.io", name, verb)
    for name in CONVERTED_CRDS
    for verb in ("get", "patch")
}


def webhook_secret_rules(release: Release) -> set[tuple[str, str, str]]:
    return {("secrets", release.webhook_secret, v) for v in ("get", "update")} | {
        ("secrets", "", "create")
    }


# CloudAccounts, ResourceClasses and namespaces are cluster-scoped: every operator reads them
# (which account and class a namespace may use); only a cluster-wide one keeps CloudAccounts'
# and ResourceClasses' finalizers and status.
ACCOUNT_READS = {
    (f"{plural}.{GROUP}", "", v)
    for plural in ("cloudaccounts", "resourceclasses")
    for v in ("get", "list", "watch")
} | {("namespaces", "", v) for v in ("get", "list", "watch")}
ACCOUNT_WRITES = {
    (f"{plural}{sub}.{GROUP}", "", "patch")
    for plural in ("cloudaccounts", "resourceclasses")
    for sub in ("", "/status")
}


def operator_rules(peering_plural: str | None) -> set[tuple[str, str, str]]:
    expected = set()
    for kind in KINDS:
        # delete: a resource whose spec.ttl or spec.expiresAt has come
        verbs = ("get", "list", "watch", "patch", "delete")
        expected |= {(f"{kind}.{GROUP}", "", v) for v in verbs}
        expected.add((f"{kind}/status.{GROUP}", "", "patch"))
        expected.add((f"{kind}/finalizers.{GROUP}", "", "update"))
    expected |= {("secrets", "", v) for v in ("get", "create", "update", "delete")}
    expected.add(("events", "", "create"))
    if peering_plural:
        expected |= {(f"{peering_plural}.kopf.dev", "", v) for v in ("list", "watch")}
        expected |= {(f"{peering_plural}.kopf.dev", PEERING, v) for v in ("get", "patch")}
    return expected


# Lint and render ---------------------------------------------------------------------------


def test_lint_is_clean(helm):
    for sets in ([], ["--set", "watchNamespaces={a,b}"], ["--set", "replicas=1"]):
        result = helm("lint", "--strict", str(CHART), *sets)
        assert "0 chart(s) failed" in result.stdout
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_template_renders_and_the_crds_are_accepted_by_the_apiserver(kube, helm, tmp_path):
    result = helm(
        "template", "provisioner", str(CHART), "-n", "provisioner-system", "--include-crds"
    )
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert sorted(d["metadata"]["name"] for d in crds) == sorted(
        [f"{k}.{GROUP}" for k in (*KINDS, "cloudaccounts", "resourceclasses")]
        + ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    )
    # Created (dry run) under a group of their own: the session's CRDs stay as they are, with
    # their conversion pointed at the session's webhook (an apply over them would add the
    # chart's Service beside the webhook's URL).
    group = f"dry-{suffix()}.example.dev"
    for crd in crds:
        crd["spec"]["group"] = group
        crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    path = tmp_path / "crds.yaml"
    path.write_text(yaml.safe_dump_all(crds))
    kube.kubectl("create", "--dry-run=server", "-f", str(path))
    converted = [d for d in crds if "conversion" in d["spec"]]
    assert sorted(d["spec"]["names"]["plural"] for d in converted) == sorted(KINDS)
    for crd in converted:
        assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"] == {
            "namespace": "provisioner-system",
            "name": "provisioner-webhook",
            "port": 9443,
            "path": "/convert",
        }
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {d["kind"] for d in docs} >= {"ServiceAccount", "ClusterRole", "Deployment", "Service"}


# Installed objects ---------------------------------------------------------------------------


def test_cluster_wide_install_creates_its_objects(kube, cluster_wide):
    ns, name = cluster_wide.namespace, cluster_wide.name
    full = f"{name}-provisioner"
    deployment = json.loads(kube.kubectl("get", "deployment", full, "-n", ns, "-o", "json").stdout)
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == cluster_wide.service_account
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    kube.kubectl("get", "serviceaccount", cluster_wide.service_account, "-n", ns)
    kube.kubectl("get", "service", f"{full}-metrics", "-n", ns)
    kube.kubectl("get", "service", f"{full}-webhook", "-n", ns)
    kube.kubectl("get", "clusterrole", full)
    kube.kubectl("get", "clusterrole", f"{full}-crds")
    kube.kubectl("get", "poddisruptionbudget", full, "-n", ns)
    kube.kubectl("get", "clusterkopfpeering.kopf.dev", PEERING)
    binding = json.loads(kube.kubectl("get", "clusterrolebinding", full, "-o", "json").stdout)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": cluster_wide.service_account, "namespace": ns}
    ]
    # Namespaced RBAC: only the webhook's Secret, in the release namespace.
    roles = kube.kubectl(
        "get", "roles,rolebindings", "-A", "-l", f"app.kubernetes.io/instance={name}", "-o",
        "jsonpath={range .items[*]}{.kind} {.metadata.namespace}/{.metadata.name}{'\\n'}{end}",
    )  # fmt: skip
    assert sorted(roles.stdout.split("\n")[:-1]) == [
        f"Role {ns}/{full}-webhook",
        f"RoleBinding {ns}/{full}-webhook",
    ]


def test_namespaced_install_creates_only_namespaced_rbac(kube, namespaced):
    own, name = namespaced.watched, namespaced.name
    full = f"{name}-provisioner"
    kube.kubectl("get", "deployment", full, "-n", namespaced.namespace)
    kube.kubectl("get", "serviceaccount", namespaced.service_account, "-n", namespaced.namespace)
    kube.kubectl("get", "role", full, "-n", own)
    binding = json.loads(kube.kubectl("get", "rolebinding", full, "-n", own, "-o", "json").stdout)
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": namespaced.service_account,
            "namespace": namespaced.namespace,
        }
    ]
    kube.kubectl("get", "kopfpeering.kopf.dev", PEERING, "-n", own)
    # Cluster-wide: only its CRDs (by name) and reading CloudAccounts and namespaces (bound),
    # the account-admin role for platform admins and the roles aggregated into view and edit
    # (bound to nobody).
    selector = f"app.kubernetes.io/instance={name}"
    cluster_scoped = kube.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout.split()
    assert sorted(cluster_scoped) == sorted(
        [
            # its own CRDs' conversion webhook, by name
            f"clusterrole.rbac.authorization.k8s.io/{full}-crds",
            f"clusterrolebinding.rbac.authorization.k8s.io/{full}-crds",
            f"clusterrole.rbac.authorization.k8s.io/{full}-accounts",
            f"clusterrole.rbac.authorization.k8s.io/{full}-account-admin",
            f"clusterrolebinding.rbac.authorization.k8s.io/{full}-accounts",
            # aggregated into the standard view/edit/admin roles, bound to nobody here
            f"clusterrole.rbac.authorization.k8s.io/{full}-view",
            f"clusterrole.rbac.authorization.k8s.io/{full}-edit",
        ]
    )


# Least privilege ---------------------------------------------------------------------------


def test_cluster_wide_token_has_exactly_the_operator_rules(kube, cluster_wide, baseline, namespace):
    expected = operator_rules("clusterkopfpeerings") | ACCOUNT_READS | ACCOUNT_WRITES | CRD_RULES
    assert granted(kube, cluster_wide, baseline, namespace) == expected
    assert granted(kube, cluster_wide, baseline, "kube-system") == expected
    assert granted(kube, cluster_wide, baseline, cluster_wide.namespace) == (
        expected | webhook_secret_rules(cluster_wide)
    )


def test_cluster_wide_token_can_do_what_the_operator_does(kube, cluster_wide, namespace):
    r, ns = cluster_wide, ["-n", namespace]
    for kind in KINDS:
        resource = f"{kind}.{GROUP}"
        for verb in ("list", "watch"):
            assert can(kube, r, verb, resource, "--all-namespaces")
        assert can(kube, r, "patch", resource, *ns)
        assert can(kube, r, "patch", resource, "--subresource=status", *ns)
        assert can(kube, r, "update", resource, "--subresource=finalizers", *ns)
    assert can(kube, r, "get", f"queues.{GROUP}", *ns)
    for verb in ("get", "create", "update", "delete"):
        assert can(kube, r, verb, "secrets", *ns)
    assert can(kube, r, "create", "events", *ns)
    assert can(kube, r, "list", "clusterkopfpeerings.kopf.dev")
    assert can(kube, r, "patch", f"clusterkopfpeerings.kopf.dev/{PEERING}")
    for crd in CONVERTED_CRDS:
        for verb in ("get", "patch"):
            assert can(kube, r, verb, f"customresourcedefinitions.apiextensions.k8s.io/{crd}")


def test_cluster_wide_token_cannot_do_anything_else(kube, cluster_wide, namespace):
    r, ns = cluster_wide, ["-n", namespace]
    denied = [
        ("list", "secrets", "--all-namespaces"),
        ("list", "secrets", *ns),
        ("watch", "secrets", *ns),
        ("patch", "secrets", *ns),
        ("create", f"s3buckets.{GROUP}", *ns),
        ("update", f"s3buckets.{GROUP}", *ns),
        ("deletecollection", f"queues.{GROUP}", *ns),
        ("create", "pods", *ns),
        ("create", "pods/exec", *ns),
        ("create", "deployments.apps", *ns),
        ("list", "configmaps", *ns),
        ("patch", "events", *ns),
        ("create", "serviceaccounts/token", *ns),
        ("delete", "namespaces"),
        ("patch", "namespaces"),
        ("create", f"cloudaccounts.{GROUP}"),
        ("update", f"cloudaccounts.{GROUP}"),
        ("delete", f"cloudaccounts.{GROUP}"),
        ("create", f"resourceclasses.{GROUP}"),
        ("update", f"resourceclasses.{GROUP}"),
        ("delete", f"resourceclasses.{GROUP}"),
        ("get", "nodes"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("update", "customresourcedefinitions.apiextensions.k8s.io"),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("patch", f"customresourcedefinitions.apiextensions.k8s.io/cloudaccounts.{GROUP}"),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io/clusterkopfpeerings.kopf.dev"),
        ("update", f"customresourcedefinitions.apiextensions.k8s.io/queues.{GROUP}"),
        ("delete", f"customresourcedefinitions.apiextensions.k8s.io/queues.{GROUP}"),
        (
            "patch",
            f"customresourcedefinitions.apiextensions.k8s.io/queues.{GROUP}",
            "--subresource=status",
        ),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
        ("bind", "clusterroles.rbac.authorization.k8s.io"),
        ("impersonate", "serviceaccounts"),
        ("patch", "clusterkopfpeerings.kopf.dev/other"),
        ("create", "clusterkopfpeerings.kopf.dev"),
        ("delete", "clusterkopfpeerings.kopf.dev"),
        ("list", "kopfpeerings.kopf.dev", *ns),
    ]
    allowed = [args for args in denied if can(kube, r, *args)]
    assert not allowed, f"the cluster-wide token may also: {allowed}"


def test_namespaced_token_has_exactly_the_operator_rules_in_its_namespace_only(
    kube, namespaced, baseline, namespace
):
    own = namespaced.watched
    cluster_wide = ACCOUNT_READS | CRD_RULES
    assert granted(kube, namespaced, baseline, own) == operator_rules("kopfpeerings") | cluster_wide
    for elsewhere in (namespace, "kube-system", "default"):
        assert granted(kube, namespaced, baseline, elsewhere) == cluster_wide, elsewhere
    # Its own namespace: the webhook's Secret.
    assert granted(kube, namespaced, baseline, namespaced.namespace) == (
        cluster_wide | webhook_secret_rules(namespaced)
    )


def test_namespaced_token_cannot_reach_outside_its_namespace(kube, namespaced, namespace):
    r, own = namespaced, ["-n", namespaced.watched]
    for verb in ("get", "create", "update", "delete"):
        assert can(kube, r, verb, "secrets", *own)
    assert can(kube, r, "patch", f"kopfpeerings.kopf.dev/{PEERING}", *own)
    home = ["-n", namespaced.namespace]
    for verb in ("get", "update"):
        assert can(kube, r, verb, f"secrets/{namespaced.webhook_secret}", *home)
    assert can(kube, r, "create", "secrets", *home)
    for crd in CONVERTED_CRDS:
        assert can(kube, r, "patch", f"customresourcedefinitions.apiextensions.k8s.io/{crd}")
    denied = [
        ("get", "secrets", "-n", "kube-system"),
        ("get", "secrets", "-n", namespace),
        ("get", "secrets", "-n", namespaced.namespace),
        ("get", "secrets/aws", "-n", namespaced.namespace),
        ("delete", f"secrets/{namespaced.webhook_secret}", "-n", namespaced.namespace),
        ("patch", f"secrets/{namespaced.webhook_secret}", "-n", namespaced.namespace),
        ("list", "secrets", "-n", namespaced.namespace),
        ("create", "secrets", "-n", namespace),
        ("get", f"secrets/{namespaced.webhook_secret}", "-n", namespace),
        ("list", "secrets", "--all-namespaces"),
        ("list", "secrets", *own),
        ("list", f"s3buckets.{GROUP}", "--all-namespaces"),
        ("watch", f"queues.{GROUP}", "-n", namespace),
        ("patch", f"queues.{GROUP}", "-n", namespace),
        ("create", "events", "-n", namespace),
        ("patch", "kopfpeerings.kopf.dev/other", *own),
        ("list", "clusterkopfpeerings.kopf.dev"),
        ("create", "pods", *own),
        ("delete", "namespaces"),
        ("patch", "namespaces"),
        ("patch", f"cloudaccounts.{GROUP}"),
        ("patch", f"cloudaccounts.{GROUP}", "--subresource=status"),
        ("patch", f"resourceclasses.{GROUP}"),
        ("create", f"resourceclasses.{GROUP}"),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("patch", f"customresourcedefinitions.apiextensions.k8s.io/cloudaccounts.{GROUP}"),
        ("create", "rolebindings.rbac.authorization.k8s.io", *own),
    ]
    allowed = [args for args in denied if can(kube, r, *args)]
    assert not allowed, f"the namespaced token may also: {allowed}"


def test_webhook_permissions_hold_for_real(kube, namespaced):
    """What the conversion webhook does, as the namespaced release's token: make, read and
    renew its Secret; read and patch (a server-side dry run: the session's CRDs stay pointed
    at the session's webhook) its CRDs. And nothing next to it."""
    token, home, name = namespaced.token, namespaced.namespace, namespaced.webhook_secret

    def as_release(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return kube.kubectl_as(token, *args, input=input)

    made = as_release("create", "secret", "generic", name, "-n", home, "--from-literal=tls.crt=1")
    assert made.returncode == 0, made.stderr
    try:
        got = as_release("get", "secret", name, "-n", home, "-o", "json")
        assert got.returncode == 0, got.stderr
        secret = json.loads(got.stdout)
        secret["data"]["tls.crt"] = "Mg=="
        renewed = as_release("replace", "-f", "-", input=json.dumps(secret))
        assert renewed.returncode == 0, renewed.stderr
        refused = as_release("delete", "secret", name, "-n", home)
        assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
    finally:
        kube.kubectl("delete", "secret", name, "-n", home, "--ignore-not-found")
    patch = json.dumps({"metadata": {"annotations": {f"{GROUP}/check": "rbac"}}})
    for crd in CONVERTED_CRDS:
        assert as_release("get", "crd", crd, "-o", "name").returncode == 0, crd
        patched = as_release("patch", "crd", crd, "--type=merge", "-p", patch, "--dry-run=server")
        assert patched.returncode == 0, patched.stderr
    other = as_release(
        "patch", "crd", f"cloudaccounts.{GROUP}", "--type=merge", "-p", patch, "--dry-run=server"
    )
    assert other.returncode != 0 and "forbidden" in other.stderr, other.stderr


# The operator itself, as the ServiceAccount -----------------------------------------------------


def test_operator_runs_on_the_chart_permissions_alone(kube, aws, namespaced):
    own = namespaced.watched
    assert own is not None
    log = kube.dir / f"operator-{own}.log"
    identity = f"sa-operator-{own}"
    op = OperatorProcess(
        kubeconfig=str(
            kube.token_kubeconfig(
                namespaced.service_account,
                namespaced.token,
                kube.dir / f"{own}.kubeconfig",
                namespace=namespaced.watched,
            )
        ),
        endpoint_url=kube.moto.url,
        log=log,
        # What the chart's Deployment passes with two replicas (namespaces, cluster id and
        # peering as the chart sets them), with the test suite's short resync. Its conversion
        # webhook stays off: it would point the session's CRDs at itself (its permissions
        # are checked in test_webhook_permissions_hold_for_real); it still checks the CRDs.
        extra_args=[f"--namespace={own}", f"--peering={PEERING}", "--resync-seconds=4"],
        extra_env={
            "PROVISIONER_CLUSTER_ID": own,
            "POD_ID": identity,
            "PROVISIONER_NAMESPACE": namespaced.namespace,
            "PROVISIONER_WEBHOOK": "off",
        },
    )
    op.start()
    try:
        apply(
            kube,
            own,
            "apiVersion: cloud.provisioner.dev/v1beta1\nkind: S3Bucket\n"
            "metadata:\n  name: files\nspec: {}\n"
            "---\napiVersion: cloud.provisioner.dev/v1beta1\nkind: Queue\n"
            "metadata:\n  name: dlq\nspec: {}\n"
            "---\napiVersion: cloud.provisioner.dev/v1beta1\nkind: Queue\n"
            "metadata:\n  name: jobs\nspec:\n  deadLetter: {queueRef: {name: dlq}}\n"
            "---\napiVersion: cloud.provisioner.dev/v1beta1\nkind: DatabaseInstance\n"
            "metadata:\n  name: db\nspec:\n  engine: postgres\n  instanceClass: db.t3.micro\n"
            "  storage: {sizeGiB: 20}\n  deletionPolicy: Delete\n",
        )
        bucket = wait_ready(kube, "s3bucket", own, "files", timeout=90)
        wait_ready(kube, "queue", own, "dlq", timeout=90)
        jobs = wait_ready(kube, "queue", own, "jobs", timeout=90)
        db = wait_ready(kube, "databaseinstance", own, "db", timeout=120)

        # The connection Secrets were written, and the cloud resources carry this operator's
        # cluster id: it was this operator, not another, that made them.
        for name in ("files", "dlq", "jobs", "db"):
            assert secret_data(kube, own, f"{name}-connection"), name
        bucket_name = bucket["status"]["externalName"]
        tags = aws.s3.get_bucket_tagging(Bucket=bucket_name)["TagSet"]
        assert {"Key": "provisioner.dev/cluster", "Value": own} in tags
        queue_url = jobs["status"]["queueUrl"]
        assert aws.sqs.list_queue_tags(QueueUrl=queue_url)["Tags"]["provisioner.dev/cluster"] == own
        db_id = db["status"]["externalName"]
        (instance,) = aws.rds.describe_db_instances(DBInstanceIdentifier=db_id)["DBInstances"]
        rds_tags = {t["Key"]: t["Value"] for t in instance.get("TagList", [])}
        assert rds_tags["provisioner.dev/cluster"] == own
        # Events were posted, and the peering object carries this operator's keep-alive.
        assert events(kube, own, "files"), "no Events for the bucket"
        peering = get(kube, "kopfpeering.kopf.dev", own, PEERING)
        assert identity in (peering or {}).get("status", {}), peering

        for kind, name in (
            ("s3bucket", "files"),
            ("queue", "jobs"),
            ("queue", "dlq"),
            ("databaseinstance", "db"),
        ):
            kube.kubectl("delete", kind, name, "-n", own, "--wait=false")
        for kind, name in (
            ("s3bucket", "files"),
            ("queue", "jobs"),
            ("queue", "dlq"),
            ("databaseinstance", "db"),
        ):
            wait_gone(kube, kind, own, name, timeout=120)
        for name in ("files", "dlq", "jobs", "db"):
            assert secret_data(kube, own, f"{name}-connection") is None, name
        assert bucket_name not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]
        wait_for(
            lambda: (
                not any(
                    u.endswith(jobs["status"]["externalName"])
                    for u in aws.sqs.list_queues().get("QueueUrls", [])
                )
            ),
            what="the queue to be gone from the cloud",
        )
    finally:
        op.stop()
    # A denial anywhere in what it logged: a 403 status or "forbidden". Each line's own
    # timestamp is left out first: its milliseconds are ",403" one line in a thousand.
    refused = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if REFUSED.search(LOG_PREFIX.sub("", line, count=1))
    ]
    assert not refused, f"refused in {log}: {refused[:3]}"


def test_access_irsa_adds_only_get_and_patch_on_serviceaccounts(helm):
    """access.mode=irsa: the operator reads a granted ServiceAccount and sets its role
    annotation; nothing else is added, and nothing at all without it."""

    def rules(*sets: str) -> list[dict]:
        args = ["template", "r", str(CHART), "--namespace", "x"]
        for s in sets:
            args += ["--set", s]
        docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
        return [
            rule
            for d in docs
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "r-provisioner"
            for rule in d["rules"]
        ]

    default = rules()
    assert default
    assert not any("serviceaccounts" in rule["resources"] for rule in default)
    irsa = rules("access.mode=irsa", "access.oidcIssuer=https://oidc.example/id/X")
    assert [rule for rule in irsa if rule not in default] == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "patch"]}
    ]
    assert rules("access.mode=pod-identity", "access.eksCluster=prod") == default
    missing = helm("template", "r", str(CHART), "--set", "access.mode=irsa", check=False)
    assert missing.returncode != 0
    assert "access.oidcIssuer" in missing.stderr


# The CRDs as part of the release ------------------------------------------------------------


@pytest.fixture
def bare_cluster(tmp_path) -> Iterator[Kubectl]:
    """A control plane of the test's own without any CRD (the shared one's must stay as they
    are: pointed at the session's webhook)."""
    if needs_own_controlplane.args[0]:
        pytest.skip(needs_own_controlplane.kwargs["reason"])
    cp = ControlPlane(tmp_path / "controlplane", ensure_binaries())
    try:
        cp.start()
        yield Kubectl(cp.kubeconfig)
    finally:
        cp.stop()


def test_the_release_installs_keeps_and_hands_over_its_crds(bare_cluster, tmp_path):
    """- a cluster without any CRD: `helm install` with the default values (two replicas, so
      a ClusterKopfPeering) works: kopf's peering CRDs come first, from Helm's crds/;
    - `helm upgrade` and `helm uninstall` leave them (helm.sh/resource-policy: keep);
    - CRDs that another release (or kubectl, or the chart's crds/ directory before the CRDs
      became templates) put there are not adopted by `helm install`, but with
      `--take-ownership`, and then point at the new release's webhook.
    """
    kube = bare_cluster
    helm = Helm(ensure_helm(), kube.kubeconfig, tmp_path / "helm")
    names = [*CONVERTED_CRDS, f"cloudaccounts.{GROUP}"]

    def crd(name: str) -> dict:
        return kube.json("get", "crd", name)

    def install(release: str, ns: str, *flags: str, check: bool = True):
        args = ["install", release, str(CHART), "-n", ns, "--create-namespace", *flags]
        return helm(*args, "--set", "aws.region=us-east-1", check=check)

    install("first", "first-system")
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", *names)
    kube.kubectl("get", "clusterkopfpeering.kopf.dev", PEERING)
    for name in CONVERTED_CRDS:
        got = crd(name)
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert [v["name"] for v in got["spec"]["versions"] if v["storage"]] == ["v1beta1"]
        assert got["spec"]["conversion"]["webhook"]["clientConfig"]["service"] == {
            "namespace": "first-system",
            "name": "first-provisioner-webhook",
            "port": 9443,
            "path": "/convert",
        }
    helm("upgrade", "first", str(CHART), "-n", "first-system", "--reuse-values",
         "--set", "replicas=1")  # fmt: skip
    helm("uninstall", "first", "-n", "first-system")
    assert crd(f"queues.{GROUP}")["metadata"]["annotations"]["meta.helm.sh/release-name"] == (
        "first"
    )
    for name in names:
        crd(name)

    refused = install("second", "second-system", check=False)
    assert refused.returncode != 0
    assert "exists and cannot be imported into the current release" in refused.stderr
    install("second", "second-system", "--take-ownership")
    for name in CONVERTED_CRDS:
        got = crd(name)
        assert got["metadata"]["annotations"]["meta.helm.sh/release-name"] == "second"
        service = got["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
        assert (service["namespace"], service["name"]) == (
            "second-system",
            "second-provisioner-webhook",
        )
    kube.kubectl("get", "service", "second-provisioner-webhook", "-n", "second-system")


def test_sharded_replicas_run_on_the_chart_permissions_alone(kube, aws, helm, tmp_path):
    """sharding.enabled: two replicas with the release's token (namespaced) hold their Leases,
    split two queues' worth of work and delete them, with no 403 anywhere in their logs."""
    s = suffix()
    own = f"own-{s}"
    kube.kubectl("create", "namespace", own)
    release = install(
        kube,
        helm,
        f"sh-{s}",
        f"prov-sh-{s}",
        f"watchNamespaces={{{own}}}",
        f"clusterId={own}",
        "sharding.enabled=true",
    )
    kubeconfig = kube.token_kubeconfig(
        release.service_account, release.token, tmp_path / "sh.kubeconfig", namespace=own
    )
    logs = [kube.dir / f"operator-{own}-{i}.log" for i in range(2)]
    ops = [
        OperatorProcess(
            kubeconfig=str(kubeconfig),
            endpoint_url=kube.moto.url,
            log=log,
            # As the chart's Deployment runs them with sharding (its webhook off, as above).
            extra_args=[f"--namespace={own}", "--sharding=on", "--resync-seconds=4"],
            extra_env={
                "PROVISIONER_CLUSTER_ID": own,
                "PROVISIONER_SHARD_NAME": f"pod-{i}",
                "PROVISIONER_SHARD_RING": release.name,
                "PROVISIONER_NAMESPACE": release.namespace,
                "PROVISIONER_WEBHOOK": "off",
            },
        )
        for i, log in enumerate(logs)
    ]
    try:
        for op in ops:
            op.start()
        names = [f"q{i}" for i in range(6)]
        apply(
            kube,
            own,
            "".join(
                f"---\napiVersion: cloud.provisioner.dev/v1beta1\nkind: Queue\n"
                f"metadata:\n  name: {n}\nspec: {{}}\n"
                for n in names
            ),
        )
        shards = {
            wait_ready(kube, "queue", own, n, timeout=90)["metadata"]["labels"][
                "sharding.cloud.provisioner.dev/shard"
            ]
            for n in names
        }
        assert shards <= {"pod-0", "pod-1"}, shards
        leases = json.loads(
            kube.kubectl("get", "leases", "-n", release.namespace, "-o", "json").stdout
        )
        assert {"pod-0", "pod-1"} <= {i["spec"]["holderIdentity"] for i in leases["items"]}
        kube.kubectl("delete", "queues", "--all", "-n", own, "--wait=false")
        for n in names:
            wait_gone(kube, "queue", own, n, timeout=90)
    finally:
        for op in ops:
            op.stop()
        uninstall(kube, helm, release)
        kube.kubectl("delete", "namespace", own, "--wait=false", check=False)
    for log in logs:
        refused = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if REFUSED.search(LOG_PREFIX.sub("", line, count=1))
        ]
        assert not refused, f"refused in {log}: {refused[:3]}"
