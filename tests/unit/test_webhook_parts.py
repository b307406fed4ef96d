"""The conversion webhook's parts that need no API server: certificates, CRD checks, config."""

from __future__ import annotations

import base64
import datetime
import subprocess
import sys

import pytest

from provisioner import webhook, webhook_certs
from provisioner.config import Settings

NAMES = webhook_certs.dns_names("provisioner-system/provisioner-webhook")


def test_certificate_names_the_service_and_loopback():
    from cryptography import x509

    certs = webhook_certs.generate(NAMES)
    cert = x509.load_pem_x509_certificate(certs.cert_pem)
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "provisioner-webhook.provisioner-system.svc" in alt.get_values_for_type(x509.DNSName)
    assert {str(a) for a in alt.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert not webhook_certs.due(certs, NAMES)


def test_renewal_keeps_the_ca_so_the_ca_bundle_does_not_change():
    certs = webhook_certs.generate(NAMES)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=340)
    assert webhook_certs.due(certs, NAMES, now=later)
    renewed = webhook_certs.generate(NAMES, certs)
    assert renewed.ca_pem == certs.ca_pem and renewed.cert_pem != certs.cert_pem


def test_a_new_name_makes_the_certificate_due():
    certs = webhook_certs.generate(webhook_certs.dns_names(""))
    assert webhook_certs.due(certs, NAMES)


def test_secret_round_trip():
    certs = webhook_certs.generate(NAMES)
    secret = {"data": certs.to_data(), "metadata": {"annotations": certs.annotations()}}
    assert webhook_certs.Certificates.from_secret(secret) == certs
    assert webhook_certs.Certificates.from_json(certs.to_json()) == certs
    assert webhook_certs.Certificates.from_secret({"data": {"tls.crt": "x"}}) is None


def crd(versions: list[str], strategy: str = "Webhook") -> dict:
    return {
        "spec": {
            "versions": [{"name": v, "served": True} for v in versions],
            "conversion": {"strategy": strategy},
        }
    }


def test_crd_check_refuses_old_crds_in_one_line():
    name = "queues.cloud.provisioner.dev"
    webhook.check_crd(crd(["v1alpha1", "v1beta1"]), name)
    for bad, said in [
        (crd(["v1alpha1"]), "does not serve v1beta1"),
        (crd(["v1alpha1", "v1beta1"], "None"), "no conversion webhook"),
        (None, "is not installed"),
    ]:
        with pytest.raises(webhook.CrdError) as found:
            webhook.check_crd(bad, name)
        assert said in str(found.value) and "\n" not in str(found.value)
        assert "kubectl apply --server-side" in str(found.value)


def test_client_config_service_in_a_cluster_loopback_outside():
    ca = b"-----BEGIN CERTIFICATE-----\n"
    inside = webhook.client_config(Settings(webhook_service="ops/prov-webhook"), ca)
    assert inside["service"] == {
        "namespace": "ops",
        "name": "prov-webhook",
        "port": 9443,
        "path": "/convert",
    }
    assert base64.b64decode(inside["caBundle"]) == ca
    outside = webhook.client_config(Settings(webhook_port=19443), ca)
    assert outside["url"] == "https://127.0.0.1:19443/convert" and "service" not in outside


def test_the_operator_never_loads_cryptography():
    """Certificates are made in a child process; due-ness is read from annotations."""
    script = (
        "import sys; from provisioner import webhook, webhook_certs as w; "
        "c = w.generate_apart(['svc']); assert not w.due(c, ['svc']); "
        "r = w.generate_apart(['svc'], c); assert r.ca_pem == c.ca_pem; "
        "print(sorted(m for m in sys.modules if m.startswith('cryptography')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout
