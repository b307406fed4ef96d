"""Who a resource names, as a tenant with `edit` in its namespace meets it: the annotation
`cloud.provisioner.dev/requested-by` where no MutatingAdmissionPolicy stamps it (Kubernetes
before 1.36, `requestedBy.enabled=false`, a namespace outside its selector), the operator that
cannot know whether anything checked it, and the sharding labels, which are the operator's.

The chart's policies are rendered with helm and applied with a namespace selector that matches
only this module's namespaces, so the rest of the suite never meets them.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from provisioner_dev.binaries import cached_helm, ensure_helm
from tests.conftest import Cluster
from tests.helpers import assert_refused, events, get, wait_for, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300 if cached_helm() else 1200)]
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "provisioner"
REQUESTED_BY = "cloud.provisioner.dev/requested-by"
SHARD = "sharding.cloud.provisioner.dev/shard"
DRAIN = "sharding.cloud.provisioner.dev/drain"
# Where the rendered release "lives": only the operator's ServiceAccount name comes from it.
RELEASE_NAMESPACE = "admission-ops"


@dataclass
class Policies:
    label: str  # key=value that selects the namespaces the policies apply to
    release: str

    @property
    def operator(self) -> str:
        """The chart's operator ServiceAccount, as a username."""
        return f"system:serviceaccount:{RELEASE_NAMESPACE}:{self.release}-provisioner"


def render(release: str, template: str, *sets: str) -> list[dict]:
    """One template with the chart's values and `sets`, for an API server that serves no
    MutatingAdmissionPolicy (no --api-versions)."""
    args = [str(ensure_helm()), "template", release, str(CHART)]
    args += ["--namespace", RELEASE_NAMESPACE, "--show-only", f"templates/{template}"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def policies(cluster: Cluster) -> Iterator[Policies]:
    tag = f"a{uuid.uuid4().hex[:8]}"  # never a number to `helm --set`
    release = tag
    selector = {"matchLabels": {"admission-test": tag}}
    docs = [
        *render(
            release,
            "requested-by.yaml",
            f"requestedBy.validationNamespaceSelector.matchLabels.admission-test={tag}",
        ),
        *render(release, "sharding-labels.yaml", "sharding.enabled=true"),
        *render(release, "aggregated-roles.yaml"),
    ]
    kinds = sorted(d["kind"] for d in docs if "Admission" in d["kind"])
    assert kinds == ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"].setdefault("matchResources", {"namespaceSelector": selector})
            assert doc["spec"]["matchResources"] == {"namespaceSelector": selector}
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        yield Policies(label=f"admission-test={tag}", release=release)
    finally:
        for doc in docs:
            cluster.kubectl(
                "delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False
            )


@pytest.fixture
def checked(cluster: Cluster, own_namespace: str, policies: Policies) -> str:
    """An own-* namespace (no operator acts there) that the policies apply to."""
    cluster.kubectl("label", "namespace", own_namespace, policies.label)
    return own_namespace


def with_role(kube, namespace: str, who: str, policies: Policies) -> None:
    """`who` (a ServiceAccount, by username) holds `edit` in `namespace`, and the chart's
    rules that `edit` aggregates (bound directly: no waiting on the aggregation)."""
    _, _, sa_namespace, name = who.split(":")
    for role in ("edit", f"{policies.release}-provisioner-edit"):
        kube.kubectl(
            "create", "rolebinding", f"{name}-{role}"[:63], "-n", namespace,
            f"--clusterrole={role}", f"--serviceaccount={sa_namespace}:{name}",
        )  # fmt: skip
    wait_for(
        lambda: kube.kubectl(
            "auth", "can-i", "patch", "queues.cloud.provisioner.dev", f"--as={who}",
            "-n", namespace, check=False,
        ).stdout.strip() == "yes",
        what=f"{who}'s roles to take effect",
    )  # fmt: skip


def tenant(kube, namespace: str, policies: Policies) -> str:
    who = f"system:serviceaccount:{namespace}:tenant"
    with_role(kube, namespace, who, policies)
    return who


def queue(name: str, annotations: dict | None = None, labels: dict | None = None) -> str:
    metadata: dict = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": metadata,
        "spec": {},
    }
    return yaml.safe_dump(body)


def as_user(kube, who: str, namespace: str, *args: str, input: str | None = None):
    return kube.kubectl(f"--as={who}", "-n", namespace, *args, input=input, check=False)


# -- requested-by without the mutating policy ---------------------------------------------------


def test_a_tenant_may_name_only_itself_as_the_requester(kube, checked, policies):
    ns = checked
    who = tenant(kube, ns, policies)
    forged = queue("forged", {REQUESTED_BY: "system:admin"})

    def refused() -> bool:
        done = as_user(kube, who, ns, "create", "--dry-run=server", "-f", "-", input=forged)
        return done.returncode != 0 and REQUESTED_BY in done.stderr

    wait_for(refused, what="the API server to load the requested-by policy")
    done = as_user(kube, who, ns, "create", "-f", "-", input=forged)
    assert_refused(done, f"{REQUESTED_BY} records who created the resource")
    assert f"only its creator may set it, to their own user name ({who})" in done.stderr
    assert get(kube, "queue", ns, "forged") is None

    own = as_user(kube, who, ns, "create", "-f", "-", input=queue("own", {REQUESTED_BY: who}))
    assert own.returncode == 0, own.stderr
    unset = as_user(kube, who, ns, "create", "-f", "-", input=queue("unset"))
    assert unset.returncode == 0, unset.stderr
    assert REQUESTED_BY not in (
        get(kube, "queue", ns, "unset")["metadata"].get("annotations") or {}
    )

    # Once created, it changes for nobody: not set later, not rewritten, not removed.
    for name, change in (
        ("unset", f"{REQUESTED_BY}={who}"),
        ("own", f"{REQUESTED_BY}=system:admin"),
        ("own", f"{REQUESTED_BY}-"),
    ):
        changed = as_user(kube, who, ns, "annotate", "queue", name, "--overwrite", change)
        assert_refused(changed, "cannot be changed")
    # Other annotations are the tenant's to change.
    other = as_user(kube, who, ns, "annotate", "queue", "own", "team=payments")
    assert other.returncode == 0, other.stderr


def test_an_operator_that_cannot_trust_the_annotation_names_nobody(
    kube, start_operator, own_namespace
):
    """Where no policy checks it (here: none at all), the annotation is whatever its writer
    said; the operator, unverified by default, prints it in no Event and no log line."""
    ns = own_namespace
    op = start_operator()
    done = kube.kubectl(
        "create", "-n", ns, "-f", "-", input=queue("claimed", {REQUESTED_BY: "system:admin"})
    )
    assert done.returncode == 0
    wait_ready(kube, "queue", ns, "claimed", timeout=120)
    made = wait_for(lambda: events(kube, ns, "claimed", "Created"), what="the Created Event")
    assert "requested by" not in made[0]["message"], made[0]["message"]
    log = op.log.read_text(errors="replace")
    assert f"{ns}/claimed Created" in log
    assert "system:admin" not in log


def test_an_unknown_requested_by_mode_is_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", "run"],
        env={"PATH": "/usr/bin:/bin", "PROVISIONER_REQUESTED_BY": "trusted"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "provisioner: PROVISIONER_REQUESTED_BY='trusted': verified (an admission policy lets "
        "only the creating user set cloud.provisioner.dev/requested-by) or unverified"
    ]


# -- the sharding labels ------------------------------------------------------------------------


def test_only_the_operator_sets_or_changes_the_sharding_labels(kube, checked, policies):
    ns = checked
    who = tenant(kube, ns, policies)
    operator = policies.operator
    with_role(kube, ns, operator, policies)
    message = f"are set, changed and removed by the operator ({operator}) alone"
    labelled = queue("labelled", labels={SHARD: "replica-0"})

    def refused() -> bool:
        done = as_user(kube, who, ns, "create", "--dry-run=server", "-f", "-", input=labelled)
        return done.returncode != 0 and message in done.stderr

    wait_for(refused, what="the API server to load the sharding-labels policy")
    assert_refused(as_user(kube, who, ns, "create", "-f", "-", input=labelled), SHARD)
    made = as_user(kube, who, ns, "create", "-f", "-", input=queue("jobs"))
    assert made.returncode == 0, made.stderr
    for change in (f"{SHARD}=replica-0", f"{DRAIN}=true"):
        assert_refused(as_user(kube, who, ns, "label", "queue", "jobs", change), message)

    # The operator's ServiceAccount labels it; the tenant can neither move nor unlabel it.
    by_operator = as_user(kube, operator, ns, "label", "queue", "jobs", f"{SHARD}=replica-0")
    assert by_operator.returncode == 0, by_operator.stderr
    for change in (f"{SHARD}=replica-1", f"{SHARD}-"):
        moved = as_user(kube, who, ns, "label", "queue", "jobs", "--overwrite", change)
        assert_refused(moved, message)
    assert get(kube, "queue", ns, "jobs")["metadata"]["labels"][SHARD] == "replica-0"
    # Everything else stays the tenant's: its own labels, and the spec of a labelled resource.
    mine = as_user(kube, who, ns, "label", "queue", "jobs", "team=payments")
    assert mine.returncode == 0, mine.stderr
    spec = as_user(
        kube, who, ns, "patch", "queue", "jobs", "--type=merge",
        "-p", '{"spec": {"visibilityTimeoutSeconds": 45}}',
    )  # fmt: skip
    assert spec.returncode == 0, spec.stderr
    # And the operator hands it over: drain, then both labels removed.
    drained = as_user(kube, operator, ns, "label", "queue", "jobs", f"{DRAIN}=true")
    assert drained.returncode == 0, drained.stderr
    released = as_user(kube, operator, ns, "label", "queue", "jobs", f"{SHARD}-", f"{DRAIN}-")
    assert released.returncode == 0, released.stderr
