"""The conversion webhook's certificates in their Secret, on the real API server.

What every replica does at start and hourly (`webhook_certs.ensure`): create the Secret when
it is missing (one Secret when replicas race), leave a valid one alone, renew the serving
certificate when it is due while keeping the CA (so the CRDs' caBundle stays valid).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from provisioner.kube import login as kubelogin
from provisioner.kube.client import Kube
from provisioner.webhook import certificates as webhook_certs

pytestmark = pytest.mark.e2e

NAMES = webhook_certs.dns_names("ops/provisioner-webhook")


@pytest.fixture
def api(kube) -> Kube:
    return Kube(pool_size=4, creds=kubelogin.from_kubeconfig([Path(kube.kubeconfig)]))


def secret(kube, namespace: str) -> dict:
    found = kube.kubectl("get", "secret", "webhook-tls", "-n", namespace, "-o", "json")
    return json.loads(found.stdout)


def test_created_once_kept_then_renewed_with_the_same_ca(kube, api, namespace):
    with ThreadPoolExecutor(max_workers=3) as pool:
        made = list(
            pool.map(lambda _: webhook_certs.ensure(api, namespace, "webhook-tls", NAMES), range(3))
        )
    # Three replicas racing: one Secret, and every one serves what it holds.
    stored = webhook_certs.Certificates.from_secret(secret(kube, namespace))
    assert stored is not None and all(m == stored for m in made)
    version = secret(kube, namespace)["metadata"]["resourceVersion"]
    assert webhook_certs.ensure(api, namespace, "webhook-tls", NAMES) == stored
    assert secret(kube, namespace)["metadata"]["resourceVersion"] == version

    # Due in ten days: renewed, signed by the same CA.
    kube.kubectl(
        "annotate", "secret", "webhook-tls", "-n", namespace, "--overwrite",
        f"{webhook_certs.NOT_AFTER}=2026-12-11T00:00:00+00:00",
    )  # fmt: skip
    renewed = webhook_certs.ensure(api, namespace, "webhook-tls", NAMES)
    assert renewed.ca_pem == stored.ca_pem and renewed.ca_key_pem == stored.ca_key_pem
    assert renewed.cert_pem != stored.cert_pem and renewed.key_pem != stored.key_pem
    assert webhook_certs.Certificates.from_secret(secret(kube, namespace)) == renewed
    assert not webhook_certs.due(renewed, NAMES)
