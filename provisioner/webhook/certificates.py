"""The conversion webhook's CA and serving certificate, generated and renewed by the operator.

Both live in one Secret in the operator's namespace (`ca.crt`, `ca.key`, `tls.crt`,
`tls.key`), so that every replica serves the same certificate and the CRDs' caBundle names
one CA. The serving certificate (one year) is renewed 30 days before it expires, signed by
the same CA (ten years), so the caBundle does not change and no request fails over a
renewal. Whichever replica finds the Secret missing or due writes it; a replica that loses
that race (409) reads the winner's.

The operator never loads `cryptography` (about 11 MB of memory for a yearly task): the
certificates are made by this module run as a short child process (`python -m
provisioner.webhook.certificates`, the CA in on stdin, the result out on stdout), and when they are
due is read from the Secret's annotations.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provisioner import GROUP

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

    from provisioner.kube.client import Kube

CA_VALIDITY = datetime.timedelta(days=3650)
CERT_VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


NOT_AFTER = f"{GROUP}/webhook-cert-not-after"
CA_NOT_AFTER = f"{GROUP}/webhook-ca-not-after"
NAMES = f"{GROUP}/webhook-cert-names"


@dataclass(frozen=True)
class Certificates:
    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    # RFC 3339 times and the serving certificate's DNS names, kept beside them (annotations).
    not_after: str = ""
    ca_not_after: str = ""
    names: tuple[str, ...] = ()

    def annotations(self) -> dict[str, str]:
        return {
            NOT_AFTER: self.not_after,
            CA_NOT_AFTER: self.ca_not_after,
            NAMES: ",".join(self.names),
        }

    def to_json(self) -> str:
        return json.dumps(
            {
                **{k: v.decode() for k, v in self.pems().items()},
                "not_after": self.not_after,
                "ca_not_after": self.ca_not_after,
                "names": list(self.names),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Certificates:
        found = json.loads(text)
        return cls(
            ca_pem=found["ca.crt"].encode(),
            ca_key_pem=found["ca.key"].encode(),
            cert_pem=found["tls.crt"].encode(),
            key_pem=found["tls.key"].encode(),
            not_after=found["not_after"],
            ca_not_after=found["ca_not_after"],
            names=tuple(found["names"]),
        )

    def pems(self) -> dict[str, bytes]:
        return {
            "ca.crt": self.ca_pem,
            "ca.key": self.ca_key_pem,
            "tls.crt": self.cert_pem,
            "tls.key": self.key_pem,
        }

    def to_data(self) -> dict[str, str]:
        return {k: _b64(v) for k, v in self.pems().items()}

    @classmethod
    def from_secret(cls, secret: dict[str, Any]) -> Certificates | None:
        data = secret.get("data") or {}
        notes = (secret.get("metadata") or {}).get("annotations") or {}
        try:
            return cls(
                ca_pem=base64.b64decode(data["ca.crt"]),
                ca_key_pem=base64.b64decode(data["ca.key"]),
                cert_pem=base64.b64decode(data["tls.crt"]),
                key_pem=base64.b64decode(data["tls.key"]),
                not_after=notes.get(NOT_AFTER, ""),
                ca_not_after=notes.get(CA_NOT_AFTER, ""),
                names=tuple(n for n in notes.get(NAMES, "").split(",") if n),
            )
        except (KeyError, ValueError):
            return None


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def dns_names(service: str) -> list[str]:
    """The names the API server may use for `namespace/name` (empty: loopback only)."""
    if not service:
        return ["localhost"]
    namespace, _, name = service.partition("/")
    return [
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
        "localhost",
    ]


def due(certs: Certificates, names: list[str], now: datetime.datetime | None = None) -> bool:
    """Whether the serving certificate (or its CA) expires within RENEW_BEFORE, or lacks a
    name; read from the annotations written with it (unreadable ones: due)."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        ends = [datetime.datetime.fromisoformat(t) for t in (certs.not_after, certs.ca_not_after)]
    except ValueError:
        return True
    return any(end - now < RENEW_BEFORE for end in ends) or not set(names) <= set(certs.names)


# One builder for every CA and certificate made here and by the dev control plane's PKI:
# ECDSA P-256 keys (PKCS#8 PEM, unencrypted), SHA-256 signatures. `cryptography` is imported
# by each function, when it runs: importing this module never loads it.


@dataclass(frozen=True)
class Issued:
    """A private key and the certificate issued for it."""

    key: EllipticCurvePrivateKey
    cert: x509.Certificate

    def key_pem(self) -> bytes:
        return key_pem(self.key)

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)


def new_key() -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def subject(common_name: str, organization: str | None = None) -> x509.Name:
    """CN=`common_name`, and O=`organization` when given (Kubernetes reads it as a group)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def build_ca(
    common_name: str,
    *,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    path_length: int | None,
) -> Issued:
    """A self-signed CA: basic constraints (critical, `path_length`: None for no limit) and
    key usage digital signature, certificate and CRL signing (critical)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = new_key()
    name = subject(common_name)
    usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, cert)


def build_leaf(
    ca: Issued,
    name: x509.Name,
    *,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    server: bool,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    end_entity: bool = False,
) -> Issued:
    """A certificate for a new key, signed by `ca`: for serving (`server`) or for client
    authentication (extended key usage, not critical). The subject alternative names (not
    critical) are `dns_names` then `ip_addresses`, left out when both are empty;
    `end_entity` marks it as no CA (basic constraints, critical)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if end_entity:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def _reusable_ca(ca: Certificates | None, now: datetime.datetime) -> Issued | None:
    """`ca`'s CA when it loads and lasts at least another year, else None."""
    if ca is None:
        return None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        cert = x509.load_pem_x509_certificate(ca.ca_pem)
        key = serialization.load_pem_private_key(ca.ca_key_pem, None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if cert.not_valid_after_utc - now < datetime.timedelta(days=365):
        return None
    return Issued(key, cert)


def generate(names: list[str], ca: Certificates | None = None) -> Certificates:
    """A serving certificate for `names` and 127.0.0.1/::1, signed by `ca`'s CA (a new CA
    when None or when that CA expires within a year)."""
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)
    issuer = _reusable_ca(ca, now) or build_ca(
        "provisioner-webhook-ca", not_before=not_before, not_after=now + CA_VALIDITY, path_length=0
    )
    leaf = build_leaf(
        issuer,
        subject(names[0]),
        not_before=not_before,
        not_after=min(now + CERT_VALIDITY, issuer.cert.not_valid_after_utc),
        server=True,
        dns_names=names,
        ip_addresses=("127.0.0.1", "::1"),
    )
    return Certificates(
        ca_pem=issuer.cert_pem(),
        ca_key_pem=issuer.key_pem(),
        cert_pem=leaf.cert_pem(),
        key_pem=leaf.key_pem(),
        not_after=leaf.cert.not_valid_after_utc.isoformat(),
        ca_not_after=issuer.cert.not_valid_after_utc.isoformat(),
        names=tuple(names),
    )


def generate_apart(names: list[str], ca: Certificates | None = None) -> Certificates:
    """`generate` in a child process, so that this one never loads cryptography."""
    done = subprocess.run(
        [sys.executable, "-m", "provisioner.webhook.certificates", *names],
        input=ca.to_json() if ca is not None else "",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"generating the webhook's certificates failed: {last}")
    return Certificates.from_json(done.stdout)


def ensure(kube: Kube, namespace: str, secret_name: str, names: list[str]) -> Certificates:
    """The certificates in the Secret, written first when missing or due (see module doc)."""
    # Here, not above: building certificates (the child process, the dev PKI) needs no client.
    from provisioner.kube.client import KubeError

    for _ in range(5):
        secret = kube.get_secret(namespace, secret_name)
        certs = Certificates.from_secret(secret) if secret is not None else None
        if certs is not None and not due(certs, names):
            return certs
        fresh = generate_apart(names, certs)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": secret_name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "provisioner"},
                "annotations": fresh.annotations(),
            },
            "data": fresh.to_data(),
        }
        try:
            if secret is None:
                kube.create_secret(namespace, body)
            else:
                body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
                kube.replace_secret(namespace, secret_name, body)
        except KubeError as exc:
            if exc.status in (409, 422):
                continue  # another replica wrote it first: read theirs
            raise
        return fresh
    raise RuntimeError(f"Secret {namespace}/{secret_name} keeps changing; cannot settle it")


def main() -> None:
    """Child process: names as arguments, a CA (JSON) or nothing on stdin; JSON out."""
    given = sys.stdin.read()
    ca = Certificates.from_json(given) if given.strip() else None
    sys.stdout.write(generate(sys.argv[1:], ca).to_json())


if __name__ == "__main__":
    main()
