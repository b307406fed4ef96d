"""The Helm chart's files: CRD copies (files/crds/, rendered by templates/crds.yaml), kopf's
peering CRDs (Helm's crds/), the rendered plain manifests, and what the chart renders for the
values that change its RBAC.

The rendering tests need the helm binary; they use the cached one and are skipped when it has
not been built (`python -c 'from provisioner_dev.binaries import ensure_helm; ensure_helm()'`,
a few minutes once per machine; the e2e tests in tests/e2e/test_helm_rbac.py build it).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf._cogs.structs import references

from provisioner_dev.binaries import cached_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "provisioner"
RENDERED = ROOT / "deploy" / "manifests" / "provisioner.yaml"
KOPF_PEERING = CHART / "crds" / "kopf-peering.yaml"
CHART_CRDS = CHART / "files" / "crds"
GROUP = "cloud.provisioner.dev"


def test_chart_crds_are_byte_identical_copies_of_crds():
    sources = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert sources, "crds/ is empty"
    copies = sorted(p.name for p in CHART_CRDS.glob("*.yaml"))
    assert copies == sources, "run deploy/sync-crds.sh"
    for name in sources:
        assert (CHART_CRDS / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"deploy/helm/provisioner/files/crds/{name} differs from crds/{name}: "
            "run deploy/sync-crds.sh"
        )
    # Helm's crds/ directory holds kopf's peering CRDs only: Helm installs it before the
    # templates (the peering objects need them) and never upgrades it.
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [KOPF_PEERING.name]


def test_kopf_peering_crds_are_the_ones_kopf_uses():
    docs = [d for d in yaml.safe_load_all(KOPF_PEERING.read_text()) if d]
    by_name = {d["metadata"]["name"]: d for d in docs}
    expected = {
        references.CLUSTER_PEERINGS_K: ("clusterkopfpeerings.kopf.dev", "Cluster"),
        references.NAMESPACED_PEERINGS_K: ("kopfpeerings.kopf.dev", "Namespaced"),
    }
    assert set(by_name) == {name for name, _ in expected.values()}
    for selector, (name, scope) in expected.items():
        crd = by_name[name]
        assert crd["kind"] == "CustomResourceDefinition"
        spec = crd["spec"]
        assert spec["scope"] == scope
        (version,) = spec["versions"]
        assert version["served"] and version["storage"]
        served = references.Resource(
            group=spec["group"],
            version=version["name"],
            plural=spec["names"]["plural"],
            kind=spec["names"]["kind"],
            singular=spec["names"]["singular"],
            namespaced=scope == "Namespaced",
        )
        assert selector.check(served), f"kopf's {selector!r} does not select {served!r}"
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        # kopf writes {identity: {priority, lifetime, lastseen}} into status, to the main
        # resource (no status subresource), so the field must keep unknown keys.
        assert status["x-kubernetes-preserve-unknown-fields"] is True
        assert "subresources" not in version


def test_chart_and_app_versions():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["version"] == "0.1.0"
    assert str(chart["appVersion"]) == project["version"] == "0.1.0"


# Rendering (needs helm) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Path:
    path = cached_helm()
    if path is None:
        pytest.skip("helm is not built (provisioner_dev.binaries.ensure_helm() builds it)")
    return path


def render(helm: Path, *sets: str, check: bool = True) -> list[dict[str, Any]]:
    args = [str(helm), "template", "provisioner", str(CHART), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if not check:
        return result  # type: ignore[return-value]
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def kinds(docs: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return sorted((d["kind"], d["metadata"].get("namespace")) for d in docs)


def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]


def test_rendered_manifests_are_current(helm):
    result = subprocess.run(
        [
            str(helm),
            "template",
            "provisioner",
            str(CHART),
            "--namespace",
            "provisioner-system",
            "--include-crds",
            "--api-versions",
            "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = "# Generated by deploy/render.sh from deploy/helm/provisioner; do not edit.\n"
    expected += result.stdout
    assert RENDERED.read_text() == expected, (
        "deploy/manifests/provisioner.yaml is stale: run deploy/render.sh"
    )


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("replicas=1",),
        ("watchNamespaces={team-a,team-b}",),
        ("watchNamespaces={team-a}", "replicas=1"),
    ],
)
def test_no_wildcards_anywhere_in_rbac(helm, sets):
    for rule in rules(render(helm, *sets)):
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(key, []), rule
            assert not any("*" in value for value in rule.get(key, [])), rule


# What every release has, whatever the mode: the CRDs, the conversion webhook's Service, its
# Secret's Role (release namespace) and the ClusterRole on the CRDs, the Deployment.
COMMON = [
    *[("CustomResourceDefinition", None)] * 6,
    ("ClusterRole", None),  # get/patch of the four converted CRDs, by name
    ("ClusterRoleBinding", None),
    ("Deployment", "ops"),
    ("Role", "ops"),  # the webhook's Secret
    ("RoleBinding", "ops"),
    ("Service", "ops"),  # the webhook
    ("ServiceAccount", "ops"),
    ("ValidatingAdmissionPolicy", None),  # requested-by: nobody else's name, never changed
    ("ValidatingAdmissionPolicyBinding", None),
    ("ValidatingAdmissionPolicy", None),  # deletion-protection: no delete while it is on
    ("ValidatingAdmissionPolicyBinding", None),
    # ResourceClasses: their defaults' field names, and one per kind for enforced fields.
    *[("ValidatingAdmissionPolicy", None), ("ValidatingAdmissionPolicyBinding", None)] * 5,
]


def test_cluster_wide_mode(helm):
    docs = render(helm)
    assert kinds(docs) == sorted(
        [
            *COMMON,
            ("ClusterKopfPeering", None),
            ("ClusterRole", None),  # the operator's
            ("ClusterRole", None),  # CloudAccounts
            ("ClusterRole", None),  # account admins: bound to nobody here
            ("ClusterRole", None),  # aggregated into view, edit and admin: bound to nobody here
            ("ClusterRole", None),
            ("ClusterRoleBinding", None),
            ("ClusterRoleBinding", None),
            ("PodDisruptionBudget", "ops"),
            ("Service", "ops"),  # metrics
        ]
    )
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "provisioner"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "provisioner", "namespace": "ops"}
    ]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "PROVISIONER_NAMESPACES" not in env


def test_namespaced_mode_has_no_cluster_wide_permission_but_its_crds(helm):
    docs = render(
        helm, "watchNamespaces={team-a,team-b}", "accounts.enabled=false", "aggregatedRoles=false"
    )
    assert kinds(docs) == sorted(
        [
            *COMMON,
            ("KopfPeering", "team-a"),
            ("KopfPeering", "team-b"),
            ("PodDisruptionBudget", "ops"),
            ("Role", "team-a"),
            ("Role", "team-b"),
            ("RoleBinding", "team-a"),
            ("RoleBinding", "team-b"),
            ("Service", "ops"),  # metrics
        ]
    )
    # Cluster-wide, only its own CRDs, by name.
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["metadata"]["name"] == "provisioner-crds"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PROVISIONER_NAMESPACES"] == "team-a,team-b"
    assert env["PROVISIONER_ACCOUNTS"] == "off"


def test_namespaced_mode_with_accounts_only_reads_them_cluster_wide(helm):
    """CloudAccounts and namespaces are cluster-scoped: a namespaced operator that serves
    CloudAccounts reads them cluster-wide, and may do nothing else outside its namespaces
    (their status and finalizer are the cluster-wide operator's)."""
    docs = render(helm, "watchNamespaces={team-a,team-b}")
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert bound == {"provisioner-accounts", "provisioner-crds"}
    (role,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "provisioner-accounts"
    ]
    assert grants(role) == {
        ("cloud.provisioner.dev", plural, v)
        for plural in ("cloudaccounts", "resourceclasses")
        for v in ("get", "list", "watch")
    } | {("", "namespaces", v) for v in ("get", "list", "watch")}


def test_account_admin_role_is_shipped_unbound(helm):
    docs = render(helm)
    (admin,) = [d for d in docs if d["metadata"]["name"] == "provisioner-account-admin"]
    assert ("cloud.provisioner.dev", "cloudaccounts", "create") in grants(admin)
    assert ("cloud.provisioner.dev", "resourceclasses", "create") in grants(admin)
    assert not any(
        d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "provisioner-account-admin"
        for d in docs
    )
    (operator,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "provisioner-accounts"
    ]
    assert grants(operator) == {
        ("cloud.provisioner.dev", plural, v)
        for plural in ("cloudaccounts", "resourceclasses")
        for v in ("get", "list", "watch", "patch")
    } | {
        ("cloud.provisioner.dev", f"{plural}/status", "patch")
        for plural in ("cloudaccounts", "resourceclasses")
    } | {("", "namespaces", v) for v in ("get", "list", "watch")}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("replicas", [1, 2])
def test_exact_rules(helm, replicas):
    (role,) = [
        d
        for d in render(helm, f"replicas={replicas}")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "provisioner"
    ]
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    from provisioner.kinds.registry import KINDS

    crs = [k.plural for k in KINDS]
    expected = {
        ("cloud.provisioner.dev", cr, v)
        for cr in crs
        for v in ("get", "list", "watch", "patch", "delete")  # delete: spec.ttl's expiry
    }
    expected |= {("cloud.provisioner.dev", f"{cr}/status", "patch") for cr in crs}
    expected |= {("cloud.provisioner.dev", f"{cr}/finalizers", "update") for cr in crs}
    expected |= {("", "secrets", v) for v in ("get", "create", "update", "delete")}
    expected |= {("", "events", "create")}
    if replicas > 1:
        expected |= {
            ("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")
        }
    assert grants == expected


def test_peering_comes_with_more_than_one_replica(helm):
    docs = render(helm)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert (
        "--peering=provisioner" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    (peering,) = [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    assert peering["metadata"]["name"] == "provisioner"
    peering_rules = [r for r in rules(docs) if r["apiGroups"] == ["kopf.dev"]]
    assert peering_rules == [
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings"],
            "resourceNames": ["provisioner"],
            "verbs": ["get", "patch"],
        },
    ]
    docs = render(helm, "watchNamespaces={team-a}")
    assert [
        (d["kind"], d["metadata"]["namespace"]) for d in docs if d["kind"] == "KopfPeering"
    ] == [("KopfPeering", "team-a")]
    assert [r for r in rules(docs) if r["apiGroups"] == ["kopf.dev"]] == [
        {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["kopfpeerings"],
            "resourceNames": ["provisioner"],
            "verbs": ["get", "patch"],
        },
    ]
    single = render(helm, "replicas=1")
    assert not [d for d in single if "Peering" in d["kind"] or d["kind"] == "PodDisruptionBudget"]
    assert not [r for r in rules(single) if r["apiGroups"] == ["kopf.dev"]]
    (deployment,) = [d for d in single if d["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not any(
        "--peering" in a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_deployment_shape(helm):
    (deployment,) = [
        d
        for d in render(helm, "aws.endpointUrl=http://moto:5000", "clusterId=prod")
        if d["kind"] == "Deployment"
    ]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert container["image"] == "provisioner:0.1.0"
    assert container["args"] == [
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--peering=provisioner",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROVISIONER_REGION"] == "us-east-1"
    assert env["PROVISIONER_AWS_ENDPOINT_URL"] == "http://moto:5000"
    assert env["PROVISIONER_CLUSTER_ID"] == "prod"
    assert env["PROVISIONER_LOG_FORMAT"] == "json"
    assert env["PROVISIONER_RESYNC_SECONDS"] == "300"
    assert "AWS_ACCESS_KEY_ID" not in env
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "healthz": 8080,
        "webhook": 9443,
        "metrics": 9090,
    }
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"][0]["name"] == "tmp" and "emptyDir" in pod["volumes"][0]
    # Service links would set PROVISIONER_METRICS_PORT=tcp://... from the metrics Service.
    assert pod["enableServiceLinks"] is False


def test_credentials_from_a_secret_or_irsa(helm):
    (deployment,) = [
        d for d in render(helm, "aws.credentialsSecret=aws-creds") if d["kind"] == "Deployment"
    ]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "aws-creds", "key": key}
    assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    arn = "arn:aws:iam::123456789012:role/provisioner"
    (sa,) = [
        d
        for d in render(helm, f"serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn={arn}")
        if d["kind"] == "ServiceAccount"
    ]
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": arn}


def container_env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_tracing_is_off_by_default_and_sets_the_otel_variables_when_on(helm):
    assert not [name for name in container_env(render(helm)) if name.startswith("OTEL_")]
    env = container_env(
        render(
            helm,
            "tracing.endpoint=http://jaeger-collector.observability:4318",
            "tracing.sampleRatio=0.25",
            "tracing.headersSecret=otlp-auth",
            "tracing.extraEnv.OTEL_BSP_MAX_QUEUE_SIZE=4096",
        )
    )
    values = {name: e.get("value") for name, e in env.items()}
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger-collector.observability:4318"
    assert values["OTEL_SERVICE_NAME"] == "provisioner"
    assert values["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert values["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert values["OTEL_BSP_MAX_QUEUE_SIZE"] == "4096"
    # The pod's name and namespace, from variables set before it (the API server expands them).
    names = list(env)
    attributes = values["OTEL_RESOURCE_ATTRIBUTES"]
    for variable in ("POD_ID", "PROVISIONER_NAMESPACE"):
        assert f"$({variable})" in attributes and names.index(variable) < names.index(
            "OTEL_RESOURCE_ATTRIBUTES"
        )
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "otlp-auth",
        "key": "OTEL_EXPORTER_OTLP_HEADERS",
    }


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("watchNamespaces={team-*}",), "watchNamespaces"),
        (("watchNamespaces={!kube-system}",), "watchNamespaces"),
        (("tracing.endpoint=jaeger:4318",), "tracing"),
        (("tracing.sampleRatio=2",), "tracing"),
        (("tracing.extraEnv.AWS_SECRET_ACCESS_KEY=x",), "OTEL_"),
    ],
)
def test_refused_values(helm, sets, message):
    result = render(helm, *sets, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_every_registered_kind_has_its_crd_and_rbac():
    """The registry, the CRDs and the shipped RBAC name the same kinds: a kind added to
    provisioner.kinds.registry without its CRD (or the other way round) fails here, and the chart's
    RBAC lists come from the CRDs it carries."""
    from provisioner.kinds.registry import KINDS

    crds = {}
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["scope"] == "Namespaced":
            crds[crd["spec"]["names"]["kind"]] = crd["spec"]["names"]
    assert set(crds) == {k.kind for k in KINDS}
    for kind in KINDS:
        names = crds[kind.kind]
        assert names["plural"] == kind.plural
        assert tuple(names["shortNames"]) == kind.short_names
        assert names["categories"] == ["cloud"]

    plurals = sorted(k.plural for k in KINDS)
    role = next(
        doc
        for doc in yaml.safe_load_all(RENDERED.read_text())
        if doc and doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == "provisioner"
    )
    ours = [r for r in role["rules"] if r.get("apiGroups") == ["cloud.provisioner.dev"]]
    assert sorted(r["resources"] for r in ours) == sorted(
        [
            plurals,
            plurals,
            [f"{p}/status" for p in plurals],
            [f"{p}/finalizers" for p in plurals],
        ]
    )


def test_aggregated_roles_give_view_reading_and_edit_writing(helm):
    docs = render(helm)
    roles = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "ClusterRole"
        and d["metadata"]["name"] in ("provisioner-view", "provisioner-edit")
    }
    view, edit = roles["provisioner-view"], roles["provisioner-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    assert not any("secrets" in r["resources"] for d in roles.values() for r in d["rules"])
    assert not any("cloudaccounts" in r["resources"] for d in roles.values() for r in d["rules"])


def test_policies_are_off_by_default_and_requested_by_needs_the_api(helm):
    def policies(docs):
        return sorted(
            (d["kind"], d["metadata"]["name"]) for d in docs if "AdmissionPolicy" in d["kind"]
        )

    # Who asked is checked everywhere, on every Kubernetes version; stamped only where the
    # API server serves MutatingAdmissionPolicy.
    classes = [
        "provisioner-class-databaseinstances",
        "provisioner-class-defaults",
        "provisioner-class-queues",
        "provisioner-class-s3buckets",
        "provisioner-class-topics",
    ]
    checked = sorted(
        [
            ("ValidatingAdmissionPolicy", "provisioner-deletion-protection"),
            ("ValidatingAdmissionPolicy", "provisioner-requested-by"),
            ("ValidatingAdmissionPolicyBinding", "provisioner-deletion-protection"),
            ("ValidatingAdmissionPolicyBinding", "provisioner-requested-by"),
            *[
                (k, n)
                for n in classes
                for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
            ],
        ]
    )
    assert policies(render(helm)) == checked
    assert policies(render(helm, "requestedBy.enabled=false")) == checked
    assert policies(render(helm, "deletionProtection.enabled=false")) == [
        c for c in checked if c[1] != "provisioner-deletion-protection"
    ]
    assert policies(render(helm, "resourceClasses.enforce=false")) == [
        c for c in checked if c[1] not in classes
    ]
    args = [str(helm), "template", "provisioner", str(CHART), "--namespace", "ops"]
    args += ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
    result = subprocess.run(args, capture_output=True, text=True, check=True)
    stamped = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert policies(stamped) == sorted(
        [
            *checked,
            ("MutatingAdmissionPolicy", "provisioner-requested-by"),
            ("MutatingAdmissionPolicyBinding", "provisioner-requested-by"),
        ]
    )
    on = render(helm, "policy.enabled=true")
    assert [kind for kind, name in policies(on) if name.endswith(("-databases", "-buckets"))] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]


def requested_by_policy(docs):
    return [d for d in docs if d["metadata"]["name"] == "provisioner-requested-by"]


def test_requested_by_is_checked_on_create_and_update_and_verified_for_the_operator(helm):
    docs = render(helm)
    (policy,) = [d for d in requested_by_policy(docs) if d["kind"] == "ValidatingAdmissionPolicy"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    assert "request.userInfo.username" in policy["spec"]["validations"][0]["expression"]
    (binding,) = [
        d for d in requested_by_policy(docs) if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    # Every namespace, whatever requestedBy.namespaceSelector says (that is the stamping's).
    assert "matchResources" not in binding["spec"]
    narrowed = render(helm, "requestedBy.namespaceSelector.matchLabels.stamp=yes")
    (binding,) = [
        d for d in requested_by_policy(narrowed) if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert "matchResources" not in binding["spec"]

    def requested_by(docs):
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}["PROVISIONER_REQUESTED_BY"]

    assert requested_by(docs) == requested_by(narrowed) == "verified"
    # Checked in some namespaces only: elsewhere the annotation is a claim, named nowhere.
    some = render(helm, "requestedBy.validationNamespaceSelector.matchLabels.team=a")
    (binding,) = [
        d for d in requested_by_policy(some) if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"team": "a"}}
    }
    assert requested_by(some) == "unverified"


def test_sharding_labels_are_reserved_to_the_operators_service_account(helm):
    docs = render(helm, "sharding.enabled=true", "serviceAccount.name=op")
    policies = {d["kind"]: d for d in docs if d["metadata"]["name"].endswith("-sharding-labels")}
    assert set(policies) == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    policy = policies["ValidatingAdmissionPolicy"]["spec"]
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    (exempt,) = policy["matchConditions"]
    assert "'system:serviceaccount:ops:op'" in exempt["expression"]
    assert "sharding.cloud.provisioner.dev/" in policy["variables"][-1]["expression"]
    # Without sharding nothing reads them.
    assert not [d for d in render(helm) if d["metadata"]["name"].endswith("-sharding-labels")]


# The CRDs and the conversion webhook --------------------------------------------------------


def crds_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}


def test_crds_are_rendered_from_the_files_kept_on_uninstall_and_pointed_at_the_release(helm):
    rendered = crds_of(render(helm))
    sources = {
        crd["metadata"]["name"]: crd
        for crd in (yaml.safe_load(p.read_text()) for p in CHART_CRDS.glob("*.yaml"))
    }
    assert set(rendered) == set(sources)
    converted = set()
    for name, source in sources.items():
        crd = rendered[name]
        meta = crd["metadata"]
        assert meta["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert meta["labels"]["app.kubernetes.io/instance"] == "provisioner"
        assert meta["labels"]["app.kubernetes.io/component"] == "crds"
        if "conversion" in source["spec"]:
            converted.add(name)
            service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
            assert service == {
                "namespace": "ops",
                "name": "provisioner-webhook",
                "port": 9443,
                "path": "/convert",
            }
            assert "caBundle" not in crd["spec"]["conversion"]["webhook"]["clientConfig"]
            source["spec"]["conversion"]["webhook"]["clientConfig"]["service"] = service
        # Besides the metadata and the webhook's Service, exactly the file.
        assert crd["spec"] == source["spec"], name
    from provisioner.kinds.registry import KINDS

    assert converted == {f"{k.plural}.{GROUP}" for k in KINDS}


def test_crds_follow_the_release_name_and_namespace_or_are_left_out(helm):
    args = [str(helm), "template", "other", str(CHART), "--namespace", "platform"]
    result = subprocess.run(args, capture_output=True, text=True, check=True)
    for crd in crds_of([d for d in yaml.safe_load_all(result.stdout) if d]).values():
        if "conversion" in crd["spec"]:
            service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
            assert (service["namespace"], service["name"]) == (
                "platform",
                "other-provisioner-webhook",
            )
    off = render(helm, "crds.install=false")
    assert not crds_of(off)
    # The RBAC still comes from the chart's CRD files.
    assert rules(off) == rules(render(helm))


def test_webhook_service_port_and_settings(helm):
    docs = render(helm)
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "provisioner-webhook"
    ]
    assert service["metadata"]["namespace"] == "ops"
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 9443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PROVISIONER_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env["PROVISIONER_WEBHOOK_SERVICE"]["value"] == "ops/provisioner-webhook"
    assert env["PROVISIONER_WEBHOOK_PORT"]["value"] == "9443"
    assert env["PROVISIONER_WEBHOOK_SECRET"]["value"] == "provisioner-webhook-tls"

    docs = render(helm, "webhook.port=10443", "webhook.secretName=conv-tls", "fullnameOverride=p")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROVISIONER_WEBHOOK_PORT"] == "10443"
    assert env["PROVISIONER_WEBHOOK_SECRET"] == "conv-tls"
    assert env["PROVISIONER_WEBHOOK_SERVICE"] == "ops/p-webhook"
    assert {"name": "webhook", "containerPort": 10443, "protocol": "TCP"} in container["ports"]
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "p-webhook"]
    assert role["rules"][0]["resourceNames"] == ["conv-tls"]
    (service,) = [
        d for d in docs if d["metadata"]["name"] == "p-webhook" and d["kind"] == "Service"
    ]
    assert service["spec"]["ports"][0]["port"] == 9443  # what the CRDs name


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={team-a}", "replicas=1")])
def test_webhook_rbac_is_its_crds_by_name_and_its_secret(helm, sets):
    docs = render(helm, *sets)
    from provisioner.kinds.registry import KINDS

    (crds_role,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "provisioner-crds"
    ]
    assert crds_role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": sorted(f"{k.plural}.{GROUP}" for k in KINDS),
            "verbs": ["get", "patch"],
        }
    ]
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "ops"]
    assert role["metadata"]["name"] == "provisioner-webhook"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["provisioner-webhook-tls"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    for name, kind in (("provisioner-crds", "ClusterRole"), ("provisioner-webhook", "Role")):
        (binding,) = [
            d for d in docs if d["kind"] == f"{kind}Binding" and d["metadata"]["name"] == name
        ]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kind,
            "name": name,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "provisioner", "namespace": "ops"}
        ]


def network_policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def test_network_policy_opens_the_webhook_and_metrics_ports_of_the_operator_pods(helm):
    assert network_policies(render(helm)) == []  # values-gated, off by default
    docs = render(helm, "networkPolicy.enabled=true", "webhook.port=10443")
    (policy,) = network_policies(docs)
    assert policy["metadata"]["namespace"] == "ops"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector and selector.items() <= pod_labels.items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    webhook_rule, metrics_rule = policy["spec"]["ingress"]
    assert ports["webhook"] == 10443
    assert webhook_rule == {"ports": [{"port": ports["webhook"], "protocol": "TCP"}]}
    assert metrics_rule == {"ports": [{"port": ports["metrics"], "protocol": "TCP"}]}
    # Ingress only: nothing but these two ports is open; egress stays as it was.
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]


def test_network_policy_narrows_to_the_peers_given(helm):
    api_server = "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24"
    scraper = "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring"
    egress = "networkPolicy.egress[0].ports[0].port=443"
    docs = render(helm, "networkPolicy.enabled=true", api_server, scraper, egress)
    (policy,) = network_policies(docs)
    webhook_rule, metrics_rule = policy["spec"]["ingress"]
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == [{"ports": [{"port": 443}]}]
    # No metrics port, no metrics rule.
    (policy,) = network_policies(render(helm, "networkPolicy.enabled=true", "metrics.port=0"))
    assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == [9443]


def test_policies_read_v1beta1_and_convert_v1alpha1_requests_first(helm):
    policies = [
        d
        for d in render(helm, "policy.enabled=true")
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] != "provisioner-requested-by"
        and d["metadata"]["name"] != "provisioner-class-defaults"  # on ResourceClasses
    ]
    assert len(policies) == 7  # databases, buckets, deletion-protection, one per kind's class
    assert policies
    for policy in policies:
        constraints = policy["spec"]["matchConstraints"]
        assert constraints["matchPolicy"] == "Equivalent"
        assert {v for r in constraints["resourceRules"] for v in r["apiVersions"]} == {"v1beta1"}
        text = yaml.safe_dump(policy)
        assert "allocatedStorageGiB" not in text and "writeConnectionSecretToRef" not in text
    (databases,) = [p for p in policies if p["metadata"]["name"] == "provisioner-databases"]
    assert "storage.?sizeGiB" in yaml.safe_dump(databases["spec"]["validations"])


def test_sharding_makes_every_replica_act_on_its_share(helm):
    docs = render(helm, "sharding.enabled=true", "replicas=3")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--sharding=on" in container["args"]
    assert "--shard-lease-seconds=15" in container["args"]
    assert not any(a.startswith("--peering") for a in container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["PROVISIONER_SHARD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["AWS_SDK_UA_APP_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PROVISIONER_SHARD_RING"]["value"] == "provisioner"
    # No kopf peering; several pods still roll one at a time under a disruption budget.
    assert not [d for d in docs if "Peering" in d["kind"]]
    assert not [r for r in rules(docs) if r["apiGroups"] == ["kopf.dev"]]
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert [d["kind"] for d in docs if d["kind"] == "PodDisruptionBudget"] == [
        "PodDisruptionBudget"
    ]
    # Leases of the release namespace, nothing else.
    (role,) = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-sharding")
    ]
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "create", "update", "delete"],
        }
    ]
    off = render(helm)
    assert not [d for d in off if d["metadata"]["name"].endswith("-sharding")]
    (deployment,) = [d for d in off if d["kind"] == "Deployment"]
    assert "--sharding=on" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_deletion_protection_refuses_the_delete_of_a_protected_database(helm):
    docs = [d for d in render(helm) if d["metadata"]["name"] == "provisioner-deletion-protection"]
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["DELETE"] and rule["resources"] == ["databaseinstances"]
    (validation,) = policy["spec"]["validations"]
    assert "oldObject.spec.?deletionProtection" in validation["expression"]
    assert "--type=merge" in validation["messageExpression"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    narrowed = render(helm, "deletionProtection.namespaceSelector.matchLabels.team=a")
    (binding,) = [
        d
        for d in narrowed
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d["metadata"]["name"] == "provisioner-deletion-protection"
    ]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"team": "a"}}
