"""provisioner.conversion: v1alpha1 <-> v1beta1, lossless both ways, pure, for every kind.

Property-based: the strategies below build objects as the API server holds them (the
schema's fields, each optional one present or absent, labels, annotations, finalizers,
status with conditions) and the properties must hold for every one of them.
"""

from __future__ import annotations

import copy
import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner import FINALIZER, GROUP
from provisioner.conversion import (
    FIELDS_ANNOTATION,
    HUB,
    KINDS,
    SERVED,
    V1ALPHA1,
    V1BETA1,
    convert,
    review_response,
    version_of,
)

# Fast and the same on every run: no example database, a fixed seed.
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# The values a Secret template may name, per kind (docs/api.md, "v1beta1").
TEMPLATE_VALUES = {
    "DatabaseInstance": (
        "host",
        "port",
        "username",
        "password",
        "database",
        "engine",
        "arn",
        "uri",
    ),
    "S3Bucket": ("bucket", "region", "arn", "endpoint"),
    "Queue": ("queueUrl", "queueArn", "queueName", "region"),
    "Topic": ("topicArn", "topicName", "region"),
}
# Spec fields that differ between the versions, per version.
ONLY_IN = {
    V1ALPHA1: ("writeConnectionSecretToRef", "allocatedStorageGiB"),
    V1BETA1: ("connectionSecret", "storage"),
}

Obj = dict[str, Any]

# -- building blocks ------------------------------------------------------------------------

LOWER = string.ascii_lowercase + string.digits
WORD = string.ascii_letters + string.digits


def dns_label(max_parts: int = 3) -> st.SearchStrategy[str]:
    part = st.text(LOWER, min_size=1, max_size=8)
    return st.lists(part, min_size=1, max_size=max_parts).map("-".join)


def dns_subdomain() -> st.SearchStrategy[str]:
    return st.lists(dns_label(2), min_size=1, max_size=3).map(".".join)


NAMES = dns_label()
SUBDOMAINS = dns_subdomain()
WORDS = st.text(WORD + "-_", min_size=1, max_size=12)
# Free text: annotation values, messages, tag values (JSON-looking and multi-line included).
TEXT = st.one_of(
    st.text(max_size=24),
    st.just('{"connectionSecret": {"keys": {}}}'),
    st.just("line one\nline two"),
)
TIMESTAMPS = st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))
REGIONS = st.sampled_from(["eu-west-1", "us-east-1", "us-gov-west-1", "ap-southeast-2"])
ARNS = st.builds(
    lambda service, name: f"arn:aws:{service}:eu-west-1:111111111111:{name}",
    st.sampled_from(["rds", "s3", "sqs", "sns"]),
    WORDS,
)

TAGS = st.dictionaries(
    st.text(WORD + "-_./:", min_size=1, max_size=20).filter(
        lambda k: not k.startswith(("provisioner.dev/", "aws:"))
    ),
    st.text(max_size=30),
    max_size=5,
)
LABELS = st.dictionaries(
    st.one_of(WORDS, WORDS.map(lambda w: f"app.kubernetes.io/{w}")), WORDS, max_size=4
)
# Never the reserved annotation: it is the conversion's own. Never an empty map either: the API
# server holds metadata as ObjectMeta, whose empty maps it leaves out (absent and `{}` are one).
ANNOTATIONS = st.dictionaries(
    st.one_of(
        st.sampled_from(
            [
                f"{GROUP}/paused",
                f"{GROUP}/drift-policy",
                f"{GROUP}/requested-by",
                f"{GROUP}/reconcile-requested-at",
                "kubectl.kubernetes.io/last-applied-configuration",
            ]
        ),
        WORDS.map(lambda w: f"example.com/{w}"),
    ),
    TEXT,
    min_size=1,
    max_size=4,
)


METADATA = st.fixed_dictionaries(
    {
        "name": NAMES,
        "namespace": NAMES,
        "uid": st.uuids().map(str),
        "resourceVersion": st.integers(1, 10**9).map(str),
        "generation": st.integers(1, 1000),
        "creationTimestamp": TIMESTAMPS,
    },
    optional={
        "labels": LABELS,
        "annotations": ANNOTATIONS,
        "finalizers": st.just([FINALIZER]),
        "deletionTimestamp": TIMESTAMPS,
    },
)


CONDITIONS = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["Ready", "Synced", "Drifted", "Expiring"]),
            "status": st.sampled_from(["True", "False", "Unknown"]),
        },
        optional={
            "reason": WORDS,
            "message": TEXT,
            "lastTransitionTime": TIMESTAMPS,
            "observedGeneration": st.integers(1, 1000),
        },
    ),
    unique_by=lambda condition: condition["type"],
    max_size=4,
)


def status(kind: str) -> st.SearchStrategy[Obj]:
    optional: dict[str, st.SearchStrategy[Any]] = {
        "conditions": CONDITIONS,
        "arn": ARNS,
        "externalName": WORDS,
        # A string in status (the Secret's name), whatever the spec's version.
        "connectionSecret": SUBDOMAINS,
        "account": NAMES,
        "accountId": st.just("111111111111"),
        "region": REGIONS,
        "expiresAt": TIMESTAMPS,
        "lastReconcileRequest": TEXT,
        "kopf": st.just({"progress": {"reconcile": {"retries": 1}}}),
    }
    if kind == "DatabaseInstance":
        optional |= {"endpoint": st.just("db.example:5432"), "pendingChanges": TEXT}
    if kind == "Queue":
        optional["queueUrl"] = WORDS.map(lambda w: f"https://sqs.example/111111111111/{w}")
    return st.fixed_dictionaries({"observedGeneration": st.integers(1, 1000)}, optional=optional)


ACCESS = st.lists(
    st.fixed_dictionaries(
        {"serviceAccountName": SUBDOMAINS},
        optional={"level": st.sampled_from(["read", "write", "admin"])},
    ),
    max_size=3,
)


def common_spec(kind: str) -> dict[str, st.SearchStrategy[Any]]:
    """The optional spec fields every kind has, the same in both versions."""
    policies = ["Delete", "Retain"] + (["Snapshot"] if kind == "DatabaseInstance" else [])
    fields: dict[str, st.SearchStrategy[Any]] = {
        "account": NAMES,
        "region": REGIONS,
        "tags": TAGS,
        "deletionPolicy": st.sampled_from(policies),
        "ttl": st.sampled_from(["72h", "1h30m", "7d", "30s"]),
    }
    if kind != "DatabaseInstance":
        fields["access"] = ACCESS
    return fields


def kind_spec(
    kind: str,
) -> tuple[dict[str, st.SearchStrategy[Any]], dict[str, st.SearchStrategy[Any]]]:
    """Required and optional spec fields of one kind, those both versions share."""
    if kind == "DatabaseInstance":
        return (
            {
                "engine": st.sampled_from(["postgres", "mysql", "mariadb"]),
                "instanceClass": st.sampled_from(["db.t3.micro", "db.m5.large"]),
            },
            {
                "engineVersion": st.sampled_from(["16.3", "8.0.35", "10"]),
                "instanceIdentifier": NAMES,
                "masterUsername": st.sampled_from(["app", "admin_1"]),
                "databaseName": st.sampled_from(["orders", "db_2"]),
                "port": st.integers(1150, 65535),
                "multiAZ": st.booleans(),
                "publiclyAccessible": st.booleans(),
                "backupRetentionDays": st.integers(0, 35),
            },
        )
    if kind == "S3Bucket":
        return (
            {},
            {
                "bucketName": NAMES,
                "versioning": st.booleans(),
                "encryption": st.sampled_from(["AES256", "aws:kms"]),
                "blockPublicAccess": st.booleans(),
                "lifecycle": st.fixed_dictionaries(
                    {}, optional={"expireAfterDays": st.integers(1)}
                ),
                "forceDestroy": st.booleans(),
            },
        )
    if kind == "Queue":
        return (
            {},
            {
                "queueName": WORDS,
                "fifo": st.booleans(),
                "visibilityTimeoutSeconds": st.integers(0, 43200),
                "messageRetentionSeconds": st.integers(60, 1209600),
                "delaySeconds": st.integers(0, 900),
                "deadLetter": st.fixed_dictionaries(
                    {"queueRef": st.fixed_dictionaries({"name": SUBDOMAINS})},
                    optional={"maxReceiveCount": st.integers(1, 1000)},
                ),
                "subscribeTo": st.lists(
                    st.fixed_dictionaries(
                        {"topicRef": st.fixed_dictionaries({"name": SUBDOMAINS})},
                        optional={"rawMessageDelivery": st.booleans()},
                    ),
                    max_size=3,
                ),
            },
        )
    assert kind == "Topic", kind
    return (
        {},
        {"topicName": WORDS, "fifo": st.booleans(), "displayName": st.text(max_size=20)},
    )


def template(kind: str) -> st.SearchStrategy[str]:
    """A Secret template: literal text and `{{ .value }}` placeholders (spaces optional)."""
    literal = st.text(
        st.characters(blacklist_characters="{}", blacklist_categories=["Cs"]), max_size=10
    )
    placeholder = st.builds(
        lambda value, left, right: "{{" + left + "." + value + right + "}}",
        st.sampled_from(TEMPLATE_VALUES[kind]),
        st.sampled_from(["", " ", "  "]),
        st.sampled_from(["", " "]),
    )
    return st.lists(st.one_of(literal, placeholder), max_size=5).map("".join)


SECRET_KEYS = st.text(WORD + "-._", min_size=1, max_size=20)


def connection_secret(kind: str) -> st.SearchStrategy[Obj]:
    """v1beta1 `spec.connectionSecret`: name and keys each present or not, an empty map too."""
    return st.fixed_dictionaries(
        {},
        optional={
            "name": SUBDOMAINS,
            "keys": st.dictionaries(SECRET_KEYS, template(kind), max_size=4),
        },
    )


STORAGE = st.fixed_dictionaries(
    {},
    optional={
        "sizeGiB": st.integers(20, 65536),
        "type": st.sampled_from(["gp2", "gp3", "io1", "io2", "standard"]),
        "iops": st.integers(1000, 256000),
    },
)


def _resources(kind: str, version: str) -> st.SearchStrategy[Obj]:
    required, optional = kind_spec(kind)
    optional = common_spec(kind) | optional
    if version == V1ALPHA1:
        optional["writeConnectionSecretToRef"] = st.fixed_dictionaries({"name": SUBDOMAINS})
        if kind == "DatabaseInstance":
            optional["allocatedStorageGiB"] = st.integers(20, 65536)
    else:
        optional["connectionSecret"] = connection_secret(kind)
        if kind == "DatabaseInstance":
            optional["storage"] = STORAGE
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just(f"{GROUP}/{version}"),
            "kind": st.just(kind),
            "metadata": METADATA,
            "spec": st.fixed_dictionaries(required, optional=optional),
        },
        optional={"status": status(kind)},
    )


# Built once: building strategies anew for every example costs more than drawing from them.
RESOURCES = {(kind, version): _resources(kind, version) for kind in KINDS for version in SERVED}


def resources(kind: str, version: str) -> st.SearchStrategy[Obj]:
    return RESOURCES[kind, version]


ANY_VERSION = {
    kind: st.one_of(RESOURCES[kind, V1ALPHA1], RESOURCES[kind, V1BETA1]) for kind in KINDS
}


def any_resource(kind: str) -> st.SearchStrategy[Obj]:
    return ANY_VERSION[kind]


# Either spelling of a version is accepted.
def spelled(version: str) -> st.SearchStrategy[str]:
    return st.sampled_from([version, f"{GROUP}/{version}"])


OTHER = {V1ALPHA1: V1BETA1, V1BETA1: V1ALPHA1}
VERSIONS = st.sampled_from([V1ALPHA1, V1BETA1])

kinds = pytest.mark.parametrize("kind", KINDS)


def without_reserved(meta: Obj) -> Obj:
    """The metadata with the reserved annotation taken out (and the map, if it held only it)."""
    meta = copy.deepcopy(meta)
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and FIELDS_ANNOTATION in annotations:
        del annotations[FIELDS_ANNOTATION]
        if not annotations:
            del meta["annotations"]
    return meta


def mutate(body: Any) -> None:
    """Change every mapping and list in `body`, at every depth."""
    if isinstance(body, dict):
        for value in body.values():
            mutate(value)
        body["mutated-by-test"] = True
    elif isinstance(body, list):
        for value in body:
            mutate(value)
        body.append("mutated-by-test")


# -- round trips ----------------------------------------------------------------------------


@kinds
@PROPERTY
@given(data=st.data())
def test_v1alpha1_to_v1beta1_and_back_is_the_original(kind: str, data: st.DataObject) -> None:
    original = data.draw(resources(kind, V1ALPHA1))
    there = convert(original, V1BETA1)
    assert there["apiVersion"] == f"{GROUP}/{V1BETA1}"
    assert convert(there, V1ALPHA1) == original


@kinds
@PROPERTY
@given(data=st.data())
def test_v1beta1_to_v1alpha1_and_back_is_the_original(kind: str, data: st.DataObject) -> None:
    original = data.draw(resources(kind, V1BETA1))
    there = convert(original, V1ALPHA1)
    assert there["apiVersion"] == f"{GROUP}/{V1ALPHA1}"
    assert convert(there, V1BETA1) == original

    # The annotation is there exactly when v1alpha1 has no place for something, and holds
    # only that (the name and the size have theirs).
    annotations = there["metadata"].get("annotations") or {}
    secret = original["spec"].get("connectionSecret")
    storage = original["spec"].get("storage")
    lossy = (secret is not None and set(secret) != {"name"}) or (
        storage is not None and set(storage) != {"sizeGiB"}
    )
    assert (FIELDS_ANNOTATION in annotations) == lossy
    if lossy:
        kept = json.loads(annotations[FIELDS_ANNOTATION])
        assert "name" not in kept.get("connectionSecret", {})
        assert "sizeGiB" not in kept.get("storage", {})


# -- identity, purity, what each version holds ----------------------------------------------


@kinds
@PROPERTY
@given(data=st.data())
def test_converting_to_its_own_version_is_an_identity_and_a_copy(
    kind: str, data: st.DataObject
) -> None:
    original = data.draw(any_resource(kind))
    snapshot = copy.deepcopy(original)
    same = convert(original, data.draw(spelled(version_of(original))))
    assert same == original
    mutate(same)
    assert original == snapshot


@kinds
@PROPERTY
@given(data=st.data())
def test_converting_to_the_other_version_changes_only_what_differs(
    kind: str, data: st.DataObject
) -> None:
    original = data.draw(any_resource(kind))
    snapshot = copy.deepcopy(original)
    desired = OTHER[version_of(original)]
    out = convert(original, data.draw(spelled(desired)))

    # The input is never mutated.
    assert original == snapshot

    # Each version holds only its own spelling of the fields that differ.
    assert out["apiVersion"] == f"{GROUP}/{desired}"
    assert out["kind"] == kind
    for field in ONLY_IN[version_of(original)]:
        assert field not in out["spec"], field

    # Status, metadata but the reserved annotation, and every other spec field: as they were.
    assert out.get("status") == original.get("status")
    assert without_reserved(out["metadata"]) == original["metadata"]
    shared = set(original["spec"]) - set(ONLY_IN[V1ALPHA1]) - set(ONLY_IN[V1BETA1])
    assert {k: out["spec"][k] for k in shared} == {k: original["spec"][k] for k in shared}
    assert set(out["spec"]) - shared <= set(ONLY_IN[desired])

    # Nor is the input shared with the result: changing the result leaves it alone.
    mutate(out)
    assert original == snapshot


# -- ConversionReview -----------------------------------------------------------------------


def review(objects: list[Obj], desired: str, uid: str) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": f"{GROUP}/{desired}", "objects": objects},
    }


ALL_KINDS = st.one_of(*RESOURCES.values())


@PROPERTY
@given(
    objects=st.lists(ALL_KINDS, min_size=1, max_size=5),
    desired=VERSIONS,
    uid=st.uuids().map(str),
)
def test_a_review_converts_every_object_in_order(
    objects: list[Obj], desired: str, uid: str
) -> None:
    request = review(objects, desired, uid)
    snapshot = copy.deepcopy(request)
    answer = review_response(request)
    assert request == snapshot
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1"
    assert answer["kind"] == "ConversionReview"
    response = answer["response"]
    assert response["uid"] == uid
    assert response["result"] == {"status": "Success"}
    assert response["convertedObjects"] == [convert(o, desired) for o in objects]
    assert {o["apiVersion"] for o in response["convertedObjects"]} == {f"{GROUP}/{desired}"}
    assert [o["metadata"]["uid"] for o in response["convertedObjects"]] == [
        o["metadata"]["uid"] for o in objects
    ]


# Something a spec holds, in a corrupt annotation and in the spec: neither may be quoted.
SENTINEL = "s3cr3t-DATABASE_URL-postgresql://app:hunter2@db"
CORRUPT = st.sampled_from(
    [
        "{",
        "not json",
        '{"connectionSecret": {"keys": {"DATABASE_URL": "' + SENTINEL,
        SENTINEL,
        "",
    ]
)


def leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in leaves(v)]
    return [str(value)]


@PROPERTY
@given(
    objects=st.lists(ALL_KINDS, min_size=1, max_size=4),
    data=st.data(),
    uid=st.uuids().map(str),
)
def test_a_corrupt_annotation_fails_the_review_naming_the_object_only(
    objects: list[Obj], data: st.DataObject, uid: str
) -> None:
    corrupt = data.draw(st.one_of(*(resources(kind, V1ALPHA1) for kind in KINDS)))
    corrupt["spec"]["tags"] = {"secret": SENTINEL}
    annotations = corrupt["metadata"].setdefault("annotations", {})
    annotations[FIELDS_ANNOTATION] = data.draw(CORRUPT)
    at = data.draw(st.integers(0, len(objects)))
    objects.insert(at, corrupt)

    answer = review_response(review(objects, V1BETA1, uid))

    response = answer["response"]
    assert response["uid"] == uid
    result = response["result"]
    assert result["status"] == "Failure"
    message = result["message"]
    assert "\n" not in message and message.strip()
    meta = corrupt["metadata"]
    assert corrupt["kind"] in message
    assert f"{meta['namespace']}/{meta['name']}" in message
    assert FIELDS_ANNOTATION in message
    assert SENTINEL not in message
    where = f"{corrupt['kind']} {meta['namespace']}/{meta['name']} {FIELDS_ANNOTATION}"
    for leaf in leaves(corrupt["spec"]):
        if len(leaf) >= 6 and leaf not in where:
            assert leaf not in message, leaf


def test_the_hub_is_v1beta1() -> None:
    assert HUB == V1BETA1
    assert set(KINDS) == set(TEMPLATE_VALUES)
