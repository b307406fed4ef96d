"""The conversion webhook's limits, on the webhook the API server really calls.

Reached as the API server reaches it: the URL and CA of the CRDs' `clientConfig` (the
session's `provisioner webhook`, on loopback). A body over the cap is answered 413 before it
is sent; malformed reviews 400; the API server's own reviews, and a large one within the cap,
still convert. The chart's NetworkPolicy is accepted by the API server as rendered.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from provisioner import GROUP
from provisioner.webhook import server as webhook
from provisioner_dev.binaries import cached_helm

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "provisioner"


class Endpoint:
    def __init__(self, url: str, ca_pem: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "", parts.port or 443, parts.path
        self.context = ssl.create_default_context(cadata=ca_pem)

    @contextmanager
    def connection(self, timeout: float = 120) -> Iterator[http.client.HTTPSConnection]:
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )
        try:
            yield conn
        finally:
            conn.close()

    def post(self, body: bytes) -> tuple[int, bytes]:
        with self.connection() as conn:
            conn.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()


@pytest.fixture(scope="module")
def endpoint(kube) -> Endpoint:
    found = kube.kubectl("get", "crd", f"queues.{GROUP}", "-o", "json")
    config = json.loads(found.stdout)["spec"]["conversion"]["webhook"]["clientConfig"]
    if "url" not in config:
        pytest.skip("the conversion webhook is reached through a Service on this cluster")
    return Endpoint(config["url"], base64.b64decode(config["caBundle"]).decode())


def queue(i: int, namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": f"queue-{i}", "namespace": namespace, "uid": f"uid-{i}"},
        "spec": {
            "writeConnectionSecretToRef": {"name": f"queue-{i}-connection"},
            "tags": {f"key-{j}": "v" * 40 for j in range(12)},
        },
    }


def review(objects: list[dict[str, Any]], uid: str = "review") -> bytes:
    request = {"uid": uid, "desiredAPIVersion": f"{GROUP}/v1beta1", "objects": objects}
    body = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"}
    return json.dumps({**body, "request": request}).encode()


def test_a_body_over_the_cap_is_refused_before_it_is_sent(endpoint):
    with endpoint.connection(timeout=30) as conn:
        conn.putrequest("POST", endpoint.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(webhook.MAX_BODY_BYTES + 1))
        conn.endheaders()  # and no body at all: the answer must not wait for it
        resp = conn.getresponse()
        assert resp.status == 413, resp.read()
        assert f"at most {webhook.MAX_BODY_BYTES} bytes" in resp.read().decode()


def test_malformed_reviews_are_answered_400(endpoint):
    cases = {
        b"{": "not JSON",
        b"{}": "ConversionReview",
        review([]).replace(b'"uid": "review", ', b""): "request.uid is missing",
        review([]).replace(b'"objects": []', b'"objects": "queue-0"'): "not a list",
        review([]).replace(b'"objects": []', b'"objects": [7]'): "objects[0] is not an object",
    }
    for body, why in cases.items():
        status, text = endpoint.post(body)
        assert status == 400 and why in text.decode() and b"\n" not in text, (body, text)


def test_the_api_servers_reviews_and_a_large_one_convert_one_past_the_cap_does_not(
    kube, endpoint, namespace
):
    # A large review (6 MiB, within the cap) converting while the API server sends its own.
    one = len(json.dumps(queue(0)))
    objects = [queue(i) for i in range(6 * 2**20 // one)]
    outcome: dict[str, Any] = {}

    def send_large() -> None:
        outcome["answer"] = endpoint.post(review(objects, "large"))

    sender = threading.Thread(target=send_large)
    sender.start()
    try:
        # Written at v1alpha1: the API server converts it to v1beta1 to store it, and the
        # answer back to v1alpha1 (a server-side dry run: nothing is left behind).
        manifest = yaml.safe_dump(
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": "limits", "namespace": namespace},
                "spec": {"writeConnectionSecretToRef": {"name": "limits-connection"}},
            }
        )
        done = kube.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=manifest)
        created = json.loads(done.stdout)
        assert created["apiVersion"] == f"{GROUP}/v1alpha1"
        assert created["spec"]["writeConnectionSecretToRef"] == {"name": "limits-connection"}
    finally:
        sender.join(timeout=300)
    status, body = outcome["answer"]
    assert status == 200, body[:200]
    response = json.loads(body)["response"]
    assert response["uid"] == "large" and response["result"] == {"status": "Success"}
    converted = response["convertedObjects"]
    assert len(converted) == len(objects)
    assert converted[-1]["spec"]["connectionSecret"] == {
        "name": f"queue-{len(objects) - 1}-connection"
    }
    # The same review, still valid JSON, padded past the cap and sent in full: refused.
    large = review(objects, "large")
    status, body = endpoint.post(large + b" " * (webhook.MAX_BODY_BYTES + 1 - len(large)))
    assert status == 413, body[:200]


def test_the_chart_network_policy_is_accepted_as_rendered(kube, namespace):
    helm = cached_helm()
    if helm is None:
        pytest.skip("helm is not built (provisioner_dev.binaries.ensure_helm() builds it)")
    rendered = subprocess.run(
        [
            str(helm), "template", "provisioner", str(CHART), "--namespace", namespace,
            "--show-only", "templates/networkpolicy.yaml",
            "--set", "networkPolicy.enabled=true",
            "--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
            "--set", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
            "--set", "networkPolicy.egress[0].ports[0].port=443",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    done = kube.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=rendered.stdout
    )
    policy = json.loads(done.stdout)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "provisioner"
    ports = [r["ports"][0]["port"] for r in policy["spec"]["ingress"]]
    assert ports == [9443, 9090]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
