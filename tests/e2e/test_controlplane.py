"""The local control plane is a real one: CEL, garbage collection, namespaces, RBAC."""

from __future__ import annotations

import json
import uuid

import pytest

from provisioner_dev.binaries import KUBERNETES_VERSION
from tests.conftest import needs_own_controlplane
from tests.helpers import apply, wait_for

pytestmark = pytest.mark.e2e

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.provisioner.dev
spec:
  group: test.provisioner.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
            x-kubernetes-validations:
            - rule: "self.size <= 10"
              message: "spec.size must be at most 10"
"""


@needs_own_controlplane
def test_server_reports_the_pinned_version(kube):
    out = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == KUBERNETES_VERSION


def test_cel_rule_rejects_a_bad_object_with_its_message(kube, namespace):
    kube.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    kube.kubectl("wait", "--for=condition=Established", "crd/widgets.test.provisioner.dev")
    widget = "apiVersion: test.provisioner.dev/v1\nkind: Widget\n"
    good = widget + "metadata: {name: ok}\nspec: {size: 3}\n"
    bad = widget + "metadata: {name: bad}\nspec: {size: 11}\n"
    apply(kube, namespace, good)
    refused = kube.kubectl("apply", "-n", namespace, "-f", "-", input=bad, check=False)
    assert refused.returncode != 0
    assert "spec.size must be at most 10" in refused.stderr


def test_owned_secret_is_garbage_collected_with_its_owner(kube, namespace):
    if not kube.has_controller_manager:
        pytest.skip("no kube-controller-manager (envtest's binaries): no garbage collector")
    kube.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = json.loads(
        kube.kubectl("get", "configmap", "owner", "-n", namespace, "-o", "json").stdout
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "owned",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "stringData": {"k": "v"},
    }
    apply(kube, namespace, json.dumps(secret))
    kube.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: (
            kube.kubectl("get", "secret", "owned", "-n", namespace, check=False).returncode != 0
        ),
        timeout=60,
        what="the garbage collector to delete the owned Secret",
    )


def test_namespace_deletion_completes(kube):
    name = f"gone-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl("create", "configmap", "x", "-n", name)
    kube.kubectl("delete", "namespace", name, "--wait=false")
    wait_for(
        lambda: kube.kubectl("get", "namespace", name, check=False).returncode != 0,
        timeout=90,
        what=f"namespace {name} to be deleted",
    )


def test_service_account_without_rights_is_denied(kube, namespace):
    kube.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = kube.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    denied = kube.kubectl_as(token, "get", "secrets", "-n", namespace)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert f"system:serviceaccount:{namespace}:nobody" in denied.stderr
