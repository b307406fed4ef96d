"""Every name the API allows, through everything it is copied into.

A custom resource's name is a DNS-1123 subdomain of up to 253 characters, its namespace a
DNS-1123 label of up to 63, a ServiceAccount's name a subdomain of up to 253. Each place one
of them lands has a limit of its own: label values (63, alphanumeric at both ends), Secret
names (253), cloud names, IAM role (64) and policy (128) names, tag values (256).
"""

from __future__ import annotations

import re

import pytest

from provisioner.access import iam
from provisioner.kinds import registry as kinds
from provisioner.model import connection_secret
from provisioner.model.resource import default_secret_name, label_value

UID = "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"
# Kubernetes' own validation (apimachinery's IsDNS1123Subdomain, IsValidLabelValue).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# IAM: role names `[\w+=,.@-]+` of 1-64, inline policy names the same of 1-128.
IAM_NAME = re.compile(r"[\w+=,.@-]+")
NAMESPACE = "n" * 62 + "9"  # the longest namespace


def longest(prefix: str = "a", filler: str = "b") -> str:
    """A valid 253-character name: labels of 63 joined by dots, as long as allowed."""
    label = prefix + filler * 62
    name = ".".join([label] * 4)  # 255
    return name[:253].rstrip(".-")


# Names of every length that matters around the limits, and awkward characters at the cut.
NAMES = [
    "a",
    "orders",
    "a" * 63,
    "a" * 64,
    "a" * 100,
    "a" * 242,
    "a" * 243,
    "a" * 253,
    longest(),
    "a" * 53 + "-" + "b" * 199,  # a '-' right where a label value is cut
    "a" * 53 + "." + "b" * 199,  # a '.' there
    "a" * 232 + "-" + "b" * 20,  # a '-' right where a Secret name is cut
    "a" * 232 + "." + "b" * 20,
    "a" + "-" * 251 + "b",
]


@pytest.mark.parametrize("name", NAMES, ids=lambda n: f"{len(n)}:{n[:3]}..{n[-3:]}")
def test_every_derived_name_is_valid_where_it_goes(name):
    assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253  # the test's own input
    secret = default_secret_name(name)
    assert DNS_SUBDOMAIN.fullmatch(secret), secret
    assert len(secret) <= 253
    assert secret.endswith("-connection")
    value = label_value(name)
    assert LABEL_VALUE.fullmatch(value), value
    assert len(value) <= 63


def test_short_names_are_kept_as_they_are():
    assert default_secret_name("orders") == "orders-connection"
    assert default_secret_name("a" * 242) == "a" * 242 + "-connection"  # exactly 253
    assert label_value("orders") == "orders"
    assert label_value("a" * 63) == "a" * 63


def test_long_names_are_cut_with_a_hash_of_the_whole_name():
    name = "a" * 243
    secret = default_secret_name(name)
    assert re.fullmatch(r"a{233}-[0-9a-f]{8}-connection", secret)
    assert len(secret) == 253
    value = label_value("a" * 64)
    assert re.fullmatch(r"a{54}-[0-9a-f]{8}", value)
    # Deterministic, and two names that share the kept part still differ.
    assert default_secret_name(name) == secret
    assert default_secret_name("a" * 244) != secret
    assert label_value("a" * 64) == value != label_value("a" * 65)
    # What is cut off ends with a letter or digit: no '-' or '.' before the hash.
    assert label_value("a" * 53 + "-" + "b" * 10).startswith("a" * 53 + "-")
    assert not re.search(r"[-.]-", label_value("a" * 53 + "." + "b" * 10))
    assert not re.search(r"[-.]-", default_secret_name("a" * 232 + "." + "b" * 20))


def body(kind: str, name: str, spec: dict | None = None) -> dict:
    specs = {"DatabaseInstance": {"engine": "postgres", "instanceClass": "db.t3.micro"}}
    return {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": kind,
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": UID, "generation": 1},
        "spec": spec if spec is not None else specs.get(kind, {}),
    }


# The limits of each kind's cloud name (S3: 3-63; SQS and SNS: 80; RDS: 63).
CLOUD_NAME_LIMIT = {"S3Bucket": 63, "Queue": 80, "Topic": 256, "DatabaseInstance": 63}


@pytest.mark.parametrize("kind", sorted(kinds.BY_KIND))
@pytest.mark.parametrize("name", ["a" * 253, longest("z", "9")], ids=["as", "z9"])
def test_a_resource_of_the_longest_name(kind, name):
    resource = kinds.parse(body(kind, name), region="us-east-1", cluster_id="c" * 63)
    assert resource.secret_name == default_secret_name(name)
    assert len(resource.external_name) <= CLOUD_NAME_LIMIT[kind]
    # AWS tag values: at most 256 characters (S3, SQS, SNS, RDS alike).
    assert all(len(v) <= 256 for v in resource.desired_tags.values())
    assert resource.desired_tags["provisioner.dev/name"] == name  # whole, not cut

    secret = connection_secret.build(resource, {"k": "v"})
    meta = secret["metadata"]
    assert meta["name"] == resource.secret_name
    for key, value in meta["labels"].items():
        assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, (key, value)
    assert meta["labels"][connection_secret.OWNER_NAME_LABEL] == label_value(name)
    (owner,) = meta["ownerReferences"]
    assert owner["name"] == name and owner["uid"] == UID


def test_an_explicit_secret_name_is_used_as_written():
    resource = kinds.parse(
        body("Queue", "a" * 253, {"connectionSecret": {"name": "b" * 253}}),
        region="us-east-1",
        cluster_id="test",
    )
    assert resource.secret_name == "b" * 253


@pytest.mark.parametrize("sa", ["a", "a" * 63, "a" * 253, longest(), "a" * 52 + ".b" * 100])
def test_iam_names_of_the_longest_namespace_service_account_and_name(sa):
    sa = sa[:253]
    role = iam.role_name("c" * 63, NAMESPACE, sa)
    assert IAM_NAME.fullmatch(role) and len(role) <= 64, role
    assert not role.startswith(("-", ".")) and "-." not in role and ".-" not in role
    assert role == iam.role_name("c" * 63, NAMESPACE, sa)  # deterministic
    for kind in kinds.BY_KIND:
        policy = iam.policy_name(kind, "a" * 253, UID)
        assert IAM_NAME.fullmatch(policy) and len(policy) <= 128, policy
    # Tag values (IAM and EKS: at most 256 characters).
    assert all(len(v) <= 256 for v in iam.role_tags("c" * 63, NAMESPACE, sa).values())


def test_iam_names_of_long_service_accounts_that_share_a_beginning_differ():
    a = iam.role_name("test", NAMESPACE, "a" * 200 + "x")
    b = iam.role_name("test", NAMESPACE, "a" * 200 + "y")
    assert a != b
    assert iam.policy_name("Queue", "q" * 200 + "x", UID) != iam.policy_name(
        "Queue", "q" * 200 + "x", UID[::-1]
    )
