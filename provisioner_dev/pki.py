"""Self-generated certificates for a loopback-only control plane.

ECDSA P-256 keys: fast to generate, accepted by kube-apiserver for serving, client
authentication and service-account token signing (ES256). The CA and the certificates are
built as the operator builds its conversion webhook's (provisioner/webhook/certificates.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from provisioner.webhook.certificates import build_ca, build_leaf, key_pem, new_key, subject

VALIDITY = datetime.timedelta(days=365)
# The API server's names and addresses: loopback, the `kubernetes` Service's, and a node's
# bridge (provisioner_dev/node.py), where its pods reach it.
APISERVER_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
APISERVER_IP_ADDRESSES = ("127.0.0.1", "10.0.0.1", "10.244.0.1")


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _write_key(path: Path, pem: bytes) -> None:
    path.write_bytes(pem)
    path.chmod(0o600)


def generate(directory: Path) -> Pki:
    """A CA, a serving certificate for 127.0.0.1, client certificates, SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)

    ca = build_ca("provisioner-dev-ca", not_before=now, not_after=now + VALIDITY, path_length=None)
    pki.ca_cert.write_bytes(ca.cert_pem())
    _write_key(pki.key("ca"), ca.key_pem())

    def issue(name: str, common_name: str, org: str | None = None, *, server: bool) -> None:
        leaf = build_leaf(
            ca,
            subject(common_name, org),
            not_before=now,
            not_after=now + VALIDITY,
            server=server,
            dns_names=APISERVER_DNS_NAMES if server else (),
            ip_addresses=APISERVER_IP_ADDRESSES if server else (),
            end_entity=True,
        )
        pki.cert(name).write_bytes(leaf.cert_pem())
        _write_key(pki.key(name), leaf.key_pem())

    issue("apiserver", "kube-apiserver", server=True)
    issue("admin", "provisioner-admin", "system:masters", server=False)
    # The namespace and garbage collectors delete every kind of object; a dev control
    # plane without per-controller service accounts gives them cluster-admin.
    issue("controller-manager", "system:kube-controller-manager", "system:masters", server=False)

    sa_key = new_key()
    _write_key(pki.sa_key, key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
