"""What an installed chart puts around the operator, for `provisioner dev up`.

- The chart's admission policies and roles (deploy/helm/provisioner, rendered with helm): who
  asked (`requested-by.yaml`: the ValidatingAdmissionPolicy wherever the API server serves
  it, Kubernetes 1.30 and later, and the MutatingAdmissionPolicy that stamps it where that is
  served too) and the kinds in the standard `view`/`edit`/`admin` roles
  (`aggregated-roles.yaml`). The operator then trusts the annotation (`--requested-by=verified`).
  The policy that refuses `kubectl delete` of a DatabaseInstance with
  `spec.deletionProtection: true` (`deletion-protection.yaml`), and those that refuse a
  field a ResourceClass enforces set otherwise (`resource-classes.yaml`), served alike.
- `spec.access` through IRSA: the cluster's service-account issuer is registered as an IAM OIDC
  provider in the dev cloud, and the operator runs with `--access=irsa --oidc-issuer=<it>`.

Everything here is cluster-scoped and named after the release `provisioner-dev`, so that
`dev down` can take exactly it out of a cluster that is not ours (`remove`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from provisioner_dev.awsenv import DEV_CREDENTIALS, DEV_REGION
from provisioner_dev.binaries import REPO_ROOT, cached_helm, ensure_helm
from provisioner_dev.kubectl import kubectl, run_kubectl
from provisioner_dev.processes import wait_until

CHART = REPO_ROOT / "deploy" / "helm" / "provisioner"
RELEASE = "provisioner-dev"
# The release's namespace names nothing here (no namespaced object is rendered).
RELEASE_NAMESPACE = "provisioner-system"
ADMISSION = "admissionregistration.k8s.io/v1"
MAP_API = f"{ADMISSION}/MutatingAdmissionPolicy"
TEMPLATES = (
    "requested-by.yaml",
    "deletion-protection.yaml",
    "resource-classes.yaml",
    "aggregated-roles.yaml",
)
# The issuer when the API server does not publish one (its OIDC discovery document).
FALLBACK_ISSUER = "https://oidc.provisioner-dev.local"
REQUESTED_BY = "cloud.provisioner.dev/requested-by"
_PROBE_NAME = "provisioner-dev-probe"


def _note(message: str) -> None:
    print(f"provisioner: {message}", file=sys.stderr)


def served(kubeconfig: str | Path) -> set[str]:
    """The admissionregistration.k8s.io/v1 resources the API server serves."""
    found = run_kubectl(kubeconfig, "get", "--raw", f"/apis/{ADMISSION}")
    if found.returncode != 0:
        return set()
    return {r["name"] for r in json.loads(found.stdout).get("resources", [])}


def helm() -> Path | None:
    """helm, built on demand; with $KUBEBUILDER_ASSETS (nothing is built) only a cached one."""
    if os.environ.get("KUBEBUILDER_ASSETS"):
        return cached_helm()
    return ensure_helm()


def render(*templates: str, api_versions: tuple[str, ...] = ()) -> str:
    """The chart's templates for the release `provisioner-dev`, with its default values."""
    binary = helm()
    if binary is None:
        raise RuntimeError("helm is not built")
    args = [str(binary), "template", RELEASE, str(CHART)]
    args += ["--namespace", RELEASE_NAMESPACE]
    for version in api_versions:
        args += ["--api-versions", version]
    for template in templates:
        args += ["--show-only", f"templates/{template}"]
    result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr.strip()}")
    return result.stdout


def install(kubeconfig: str | Path, state: dict) -> None:
    """Apply the chart's policies and roles that the API server can serve, recorded in
    `state["admission"]` first (so that a failure halfway is still taken out again); wait
    until the API server enforces requested-by."""
    state["admission"] = {"objects": [], "verified": False, "stamped": False}
    if helm() is None:
        _note(
            "helm is not built (KUBEBUILDER_ASSETS: nothing is built here; `provisioner dev "
            "build` builds it): the chart's admission policies and roles are not applied, "
            f"{REQUESTED_BY} is not checked and the operator names no requester"
        )
        return
    have = served(kubeconfig)
    templates = list(TEMPLATES)
    if "validatingadmissionpolicies" not in have:
        _note(
            "the API server serves no ValidatingAdmissionPolicy (Kubernetes 1.30+): "
            f"{REQUESTED_BY} is not checked and the operator names no requester"
        )
        templates.remove("requested-by.yaml")
        templates.remove("deletion-protection.yaml")
        templates.remove("resource-classes.yaml")
    verified = "requested-by.yaml" in templates
    stamped = verified and "mutatingadmissionpolicies" in have
    text = render(*templates, api_versions=(MAP_API,) if stamped else ())
    docs = [d for d in yaml.safe_load_all(text) if d]
    state["admission"] = {
        "objects": [
            [f"{d['kind'].lower()}.{d['apiVersion'].split('/')[0]}", d["metadata"]["name"]]
            for d in docs
        ],
        "verified": verified,
        "stamped": stamped,
    }
    kubectl(kubeconfig, "apply", "-f", "-", input=text)
    if verified:
        wait_until(
            lambda: _enforced(kubeconfig, stamped),
            timeout=30,
            what="the API server to enforce the requested-by policies",
            interval=0.3,
        )


def _enforced(kubeconfig: str | Path, stamped: bool) -> bool:
    """A dry-run create naming someone else as the requester is stamped over (with the
    mutating policy) or refused (without it): the policies are loaded."""
    probe = yaml.safe_dump(
        {
            "apiVersion": "cloud.provisioner.dev/v1beta1",
            "kind": "Topic",
            "metadata": {
                "name": _PROBE_NAME,
                "namespace": "default",
                "annotations": {REQUESTED_BY: _PROBE_NAME},
            },
            "spec": {},
        }
    )
    done = run_kubectl(
        kubeconfig, "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe
    )
    if not stamped:
        return done.returncode != 0 and REQUESTED_BY in done.stderr
    if done.returncode != 0:
        return False
    annotations = json.loads(done.stdout)["metadata"].get("annotations") or {}
    return annotations.get(REQUESTED_BY) not in (None, _PROBE_NAME)


def remove(kubeconfig: str | Path, state: dict) -> None:
    """Delete what `install` applied (the bindings first: they come after their policies)."""
    for resource, name in reversed((state.get("admission") or {}).get("objects") or []):
        run_kubectl(kubeconfig, "delete", resource, name, "--ignore-not-found", "--wait=false")


def cluster_issuer(kubeconfig: str | Path) -> str:
    """The issuer of the cluster's ServiceAccount tokens (its OIDC discovery document)."""
    found = run_kubectl(kubeconfig, "get", "--raw", "/.well-known/openid-configuration")
    if found.returncode == 0:
        issuer = json.loads(found.stdout).get("issuer") or ""
        if issuer.startswith("https://"):
            return str(issuer)
    return FALLBACK_ISSUER


def register_oidc_provider(moto_url: str, issuer: str) -> None:
    """The IAM OIDC provider for `issuer` in the dev cloud's account, as an administrator
    registers a cluster's once (IRSA's roles trust it)."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=moto_url,
        region_name=DEV_REGION,
        aws_access_key_id=DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    try:
        iam.create_open_id_connect_provider(
            Url=issuer, ClientIDList=["sts.amazonaws.com"], ThumbprintList=["0" * 40]
        )
    except iam.exceptions.EntityAlreadyExistsException:
        pass


def operator_args(state: dict) -> list[str]:
    """The flags that make the dev operator run as the chart runs it."""
    args: list[str] = []
    if state.get("oidc_issuer"):
        args += ["--access=irsa", f"--oidc-issuer={state['oidc_issuer']}"]
    if (state.get("admission") or {}).get("verified"):
        args.append("--requested-by=verified")
    return args


def operator_env(state: dict) -> dict[str, str]:
    """The same as environment variables, for `.dev/env` (a developer's own `provisioner run`)."""
    env: dict[str, str] = {}
    if state.get("oidc_issuer"):
        env.update(PROVISIONER_ACCESS="irsa", PROVISIONER_OIDC_ISSUER=state["oidc_issuer"])
    if (state.get("admission") or {}).get("verified"):
        env["PROVISIONER_REQUESTED_BY"] = "verified"
    return env


def set_up(state: dict, kubeconfig: str | Path) -> None:
    """Policies, roles and the OIDC provider for a new dev environment; recorded in `state`."""
    install(kubeconfig, state)
    issuer = cluster_issuer(kubeconfig)
    register_oidc_provider(state["moto_url"], issuer)
    state["oidc_issuer"] = issuer
