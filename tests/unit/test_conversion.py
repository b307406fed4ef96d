"""provisioner.model.conversion: v1alpha1 <-> v1beta1, lossless both ways, pure, for every kind.

Property-based: the strategies below build objects as the API server holds them (the
schema's fields, each optional one present or absent, labels, annotations, finalizers,
status with conditions) and the properties must hold for every one of them.
"""

from __future__ import annotations

import copy
import json
import re
import string
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner import FINALIZER, GROUP
from provisioner.model import v1beta1_rules
from provisioner.model.conversion import (
    FIELDS_ANNOTATION,
    HUB,
    KINDS,
    MAX_FIELDS_CHARS,
    SERVED,
    V1ALPHA1,
    V1BETA1,
    ConversionError,
    convert,
    review_response,
    version_of,
)
from provisioner_dev.crdgen import FILES

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
        "passwordSecretArn",
    ),
    "S3Bucket": ("bucket", "region", "arn", "endpoint", "kmsKeyId"),
    "Queue": ("queueUrl", "queueArn", "queueName", "region", "kmsKeyId"),
    "Topic": ("topicArn", "topicName", "region", "kmsKeyId"),
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


KMS_KEYS = st.sampled_from(["alias/app", "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab"])


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
                "kmsKeyId": st.sampled_from(
                    ["alias/app", "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab"]
                ),
                "bucketKeyEnabled": st.booleans(),
                "objectOwnership": st.sampled_from(["BucketOwnerEnforced", "ObjectWriter"]),
                "cors": st.lists(
                    st.fixed_dictionaries(
                        {
                            "allowedOrigins": st.lists(st.sampled_from(["*", "https://a"])),
                            "allowedMethods": st.lists(st.sampled_from(["GET", "PUT"])),
                        },
                        optional={"maxAgeSeconds": st.integers(0, 86400)},
                    ),
                    max_size=2,
                ),
                "notifications": st.lists(
                    st.builds(
                        lambda ref, name, events, filters: {
                            ref: {"name": name},
                            "events": events,
                            **filters,
                        },
                        st.sampled_from(["queueRef", "topicRef"]),
                        SUBDOMAINS,
                        st.lists(
                            st.sampled_from(["s3:ObjectCreated:*", "s3:ObjectRemoved:Delete"]),
                            min_size=1,
                            unique=True,
                        ),
                        st.fixed_dictionaries(
                            {}, optional={"prefix": st.just("in/"), "suffix": st.just(".csv")}
                        ),
                    ),
                    max_size=2,
                ),
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
                "receiveWaitTimeSeconds": st.integers(0, 20),
                "maximumMessageSizeBytes": st.integers(1024, 262144),
                "encryption": st.one_of(
                    st.just({"type": "SQS"}),
                    st.fixed_dictionaries(
                        {"type": st.just("KMS"), "kmsKeyId": KMS_KEYS},
                        optional={"dataKeyReuseSeconds": st.integers(60, 86400)},
                    ),
                ),
                "contentBasedDeduplication": st.booleans(),
                "deduplicationScope": st.sampled_from(["messageGroup", "queue"]),
                "fifoThroughputLimit": st.sampled_from(["perQueue", "perMessageGroupId"]),
            },
        )
    assert kind == "Topic", kind
    return (
        {},
        {
            "topicName": WORDS,
            "fifo": st.booleans(),
            "displayName": st.text(max_size=20),
            "kmsKeyId": KMS_KEYS,
            "contentBasedDeduplication": st.booleans(),
        },
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


CREDENTIAL = re.compile(r"\{\{ *\.(password|uri) *\}\}")


def with_credential(keys: dict[str, str]) -> dict[str, str]:
    """DatabaseInstance keys as v1beta1 takes them: none, or one naming the password."""
    if keys and not any(CREDENTIAL.search(t) for t in keys.values()):
        return {**keys, "PGPASSWORD": "{{ .password }}"}
    return keys


def connection_secret(kind: str) -> st.SearchStrategy[Obj]:
    """v1beta1 `spec.connectionSecret`: name and keys each present or not, an empty map too."""
    keys = st.dictionaries(SECRET_KEYS, template(kind), max_size=4)
    return st.fixed_dictionaries(
        {},
        optional={
            "name": SUBDOMAINS,
            "keys": keys.map(with_credential) if kind == "DatabaseInstance" else keys,
        },
    )


IOPS = st.integers(1000, 256000)
# The storage type and IOPS v1beta1 takes together: IOPS with io1 and io2 (always) and gp3.
STORAGE_TYPES = st.one_of(
    st.just({}),
    st.sampled_from(["gp2", "gp3", "standard"]).map(lambda t: {"type": t}),
    st.builds(
        lambda t, iops: {"type": t, "iops": iops}, st.sampled_from(["io1", "io2", "gp3"]), IOPS
    ),
)
STORAGE = st.builds(
    lambda size, typed: size | typed,
    st.fixed_dictionaries({}, optional={"sizeGiB": st.integers(20, 65536)}),
    STORAGE_TYPES,
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
        # JSON, but against v1beta1's rules, each with the value in it.
        json.dumps({"connectionSecret": {"keys": {"DATABASE_URL": "{{ .nope }}" + SENTINEL}}}),
        json.dumps({"connectionSecret": {"name": SENTINEL}}),
        json.dumps({"connectionSecret": {"keys": {SENTINEL: "x"}}}),
        json.dumps({"storage": {"type": SENTINEL}}),
        json.dumps({"connectionSecret": SENTINEL}),
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


# -- v1beta1's rules on what the annotation carries -------------------------------------------
#
# The API server checks a v1alpha1 write against v1alpha1's schema, where the annotation is a
# string: the conversion checks what it lifts to v1beta1 (the storage version) itself.

ROOT = Path(__file__).resolve().parents[2]
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ONLY = {
    kind: "spec.connectionSecret.keys: a template may name only "
    + ", ".join("{{ ." + v + " }}" for v in values)
    for kind, values in TEMPLATE_VALUES.items()
}
CREDENTIAL_MESSAGE = (
    "spec.connectionSecret.keys: at least one template must name {{ .password }} or {{ .uri }}:"
    " the operator keeps the master password only in this Secret"
)
KEY_MESSAGE = "spec.connectionSecret.keys: a key is 1 to 253 of a-z, A-Z, 0-9, '-', '_' and '.'"
IOPS_TYPE = "spec.storage.iops needs spec.storage.type io1, io2 or gp3"
TYPE_IOPS = "spec.storage.type io1 and io2 need spec.storage.iops"
DB, BUCKET, QUEUE, TOPIC = KINDS


def crd_version(kind: str, version: str) -> Obj:
    crd = yaml.safe_load((ROOT / "crds" / FILES[kind]).read_text())
    found = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert len(found) == 1, (kind, version)
    return found[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


# Schema keywords the table mirrors, as (attribute of v1beta1_rules.Schema, CRD keyword).
CONSTRAINTS = {
    "type": "type",
    "min_length": "minLength",
    "max_length": "maxLength",
    "pattern": "pattern",
    "enum": "enum",
    "minimum": "minimum",
    "maximum": "maximum",
    "max_properties": "maxProperties",
}
# What the table has no need of: a default fills in, a description says.
IGNORED = {"description", "default", "properties", "additionalProperties"}


def assert_mirrors(ours: v1beta1_rules.Schema, crd: Obj, path: str) -> None:
    """The table's node is the CRD's, constraint for constraint, rule for rule."""
    unknown = set(crd) - set(CONSTRAINTS.values()) - IGNORED - {"x-kubernetes-validations"}
    assert not unknown, f"{path}: the table does not check {sorted(unknown)}"
    for attribute, keyword in CONSTRAINTS.items():
        expected = crd.get(keyword)
        expected = tuple(expected) if isinstance(expected, list) else expected
        assert getattr(ours, attribute) == expected, f"{path}: {keyword}"
    assert set(ours.properties) == set(crd.get("properties") or {}), f"{path}: properties"
    for name, node in ours.properties.items():
        assert_mirrors(node, crd["properties"][name], f"{path}.{name}")
    assert (ours.values is None) == ("additionalProperties" not in crd), path
    if ours.values is not None:
        assert_mirrors(ours.values, crd["additionalProperties"], f"{path}.*")
    # Every rule on an object alone (a transition rule compares with the stored object, which
    # a conversion never sees; v1alpha1's own rule on the same value checks it), word for word.
    rules = [r for r in crd.get("x-kubernetes-validations") or [] if "oldSelf" not in r["rule"]]
    assert [(r.rule, r.message) for r in ours.rules] == [
        (r["rule"], r["message"]) for r in rules
    ], path


@kinds
def test_the_rules_are_the_v1beta1_crds_rules(kind: str) -> None:
    new, old = crd_version(kind, V1BETA1), crd_version(kind, V1ALPHA1)
    # What v1alpha1 has no place for is what the annotation carries.
    lifted = set(new["properties"]) - set(old["properties"])
    assert set(v1beta1_rules.LIFTED[kind]) == lifted
    for name, schema in v1beta1_rules.LIFTED[kind].items():
        assert_mirrors(schema, new["properties"][name], f"spec.{name}")


def test_the_crd_messages_are_the_ones_users_read() -> None:
    # docs/api.md gives these: the table must keep them as they are.
    messages = {
        kind: [r.message for s in v1beta1_rules.LIFTED[kind].values() for r in all_rules(s)]
        for kind in KINDS
    }
    assert messages[DB] == [KEY_MESSAGE, ONLY[DB], IOPS_TYPE, TYPE_IOPS]
    for kind in (BUCKET, QUEUE, TOPIC):
        assert messages[kind] == [KEY_MESSAGE, ONLY[kind]]


def all_rules(schema: v1beta1_rules.Schema) -> list[v1beta1_rules.Cel]:
    nested = [all_rules(s) for s in schema.properties.values()]
    return [r for rules in nested for r in rules] + list(schema.rules)


def at_v1alpha1(kind: str, fields: Any, spec: Obj | None = None) -> Obj:
    """A v1alpha1 object whose annotation holds `fields` (JSON unless already a string)."""
    text = fields if isinstance(fields, str) else json.dumps(fields)
    base: Obj = {"engine": "postgres", "instanceClass": "db.t3.micro"} if kind == DB else {}
    return {
        "apiVersion": f"{GROUP}/{V1ALPHA1}",
        "kind": kind,
        "metadata": {
            "name": "orders",
            "namespace": "team",
            "annotations": {FIELDS_ANNOTATION: text},
        },
        "spec": base | (spec or {}),
    }


def refusal(body: Obj) -> str:
    """The message of the failed review of `body` to v1beta1 (the storage version)."""
    answer = review_response(review([body], V1BETA1, "uid-1"))["response"]
    assert answer["uid"] == "uid-1"
    assert answer["convertedObjects"] == []
    assert answer["result"]["status"] == "Failure", answer
    message = answer["result"]["message"]
    assert isinstance(message, str) and "\n" not in message
    return message


def refused_with(kind: str, message: str) -> str:
    return f"{kind} team/orders: annotation {FIELDS_ANNOTATION}: {message}"


def keys(**templates: Any) -> Obj:
    return {"connectionSecret": {"keys": templates}}


def storage(**fields: Any) -> Obj:
    return {"storage": fields}


NAME = "spec.connectionSecret.name"
REFUSED = [
    # What was stored unchecked before: each refused as v1beta1 refuses it.
    pytest.param(BUCKET, keys(PASSWORD="{{ .password }}"), ONLY[BUCKET], id="bucket-password"),
    pytest.param(
        BUCKET,
        {"connectionSecret": {"name": "Not_A/Valid..Name"}},
        f"{NAME} in body should match '{NAME_PATTERN}'",
        id="bad-secret-name",
    ),
    pytest.param(DB, keys(HOST="{{ .host }}"), CREDENTIAL_MESSAGE, id="db-without-password"),
    pytest.param(DB, storage(type="io1"), TYPE_IOPS, id="io1-without-iops"),
    # The rest of spec.connectionSecret.
    *(
        pytest.param(kind, keys(X="{{ ." + other + " }}"), ONLY[kind], id=f"{kind}-unknown-value")
        for kind, other in ((DB, "bucket"), (BUCKET, "host"), (QUEUE, "topicArn"), (TOPIC, "uri"))
    ),
    pytest.param(QUEUE, keys(X="{{ .queueUrl }"), ONLY[QUEUE], id="unclosed"),
    pytest.param(TOPIC, keys(X="{{ .topicArn | upper }}"), ONLY[TOPIC], id="pipeline"),
    pytest.param(BUCKET, keys(X="{ .bucket }"), ONLY[BUCKET], id="single-braces"),
    pytest.param(BUCKET, keys(X="}"), ONLY[BUCKET], id="lone-brace"),
    pytest.param(DB, keys(X="{{ .password }}", Y="{{ .nope }}"), ONLY[DB], id="db-one-bad"),
    pytest.param(BUCKET, keys(**{"a/b": "x"}), KEY_MESSAGE, id="key-slash"),
    pytest.param(BUCKET, keys(**{"a\n": "x"}), KEY_MESSAGE, id="key-final-newline"),
    pytest.param(BUCKET, keys(**{"": "x"}), KEY_MESSAGE, id="key-empty"),
    pytest.param(BUCKET, keys(**{"k" * 254: "x"}), KEY_MESSAGE, id="key-too-long"),
    pytest.param(
        BUCKET,
        keys(X="x" * 1025),
        "spec.connectionSecret.keys.X: Too long: may not be more than 1024 bytes",
        id="template-too-long",
    ),
    pytest.param(
        QUEUE,
        keys(X=7),
        'spec.connectionSecret.keys.X in body must be of type string: "integer"',
        id="template-not-string",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": {"keys": {f"k{i}": "x" for i in range(51)}}},
        "spec.connectionSecret.keys: Too many: 51: must have at most 50 items",
        id="too-many-keys",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": {"keys": ["X"]}},
        'spec.connectionSecret.keys in body must be of type object: "array"',
        id="keys-not-object",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": ""}},
        f"{NAME} in body should be at least 1 chars long",
        id="name-empty",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": "a" * 254}},
        f"{NAME}: Too long: may not be more than 253 bytes",
        id="name-too-long",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": "orders-connection\n"}},
        f"{NAME} in body should match '{NAME_PATTERN}'",
        id="name-final-newline",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": ["x"]}},
        f'{NAME} in body must be of type string: "array"',
        id="name-not-string",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": "x"},
        'spec.connectionSecret in body must be of type object: "string"',
        id="secret-not-object",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": None},
        'spec.connectionSecret in body must be of type object: "null"',
        id="secret-null",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": {"namespace": "other"}},
        'unknown field "spec.connectionSecret.namespace"'
        " (spec.connectionSecret has only name, keys)",
        id="secret-namespace",
    ),
    # spec.storage, and what no kind has.
    pytest.param(DB, storage(type="io2"), TYPE_IOPS, id="io2-without-iops"),
    pytest.param(DB, storage(iops=3000), IOPS_TYPE, id="iops-without-type"),
    pytest.param(DB, storage(type="gp2", iops=3000), IOPS_TYPE, id="iops-with-gp2"),
    pytest.param(DB, storage(type="standard", iops=3000), IOPS_TYPE, id="iops-with-standard"),
    pytest.param(
        DB,
        storage(type="sc1"),
        'spec.storage.type: Unsupported value: supported values: "gp2", "gp3", "io1", "io2",'
        ' "standard"',
        id="type-enum",
    ),
    pytest.param(
        DB,
        storage(type="io1", iops=999),
        "spec.storage.iops in body should be greater than or equal to 1000",
        id="iops-too-low",
    ),
    pytest.param(
        DB,
        storage(type="io1", iops=256001),
        "spec.storage.iops in body should be less than or equal to 256000",
        id="iops-too-high",
    ),
    pytest.param(
        DB,
        storage(type="gp3", iops="3000"),
        'spec.storage.iops in body must be of type integer: "string"',
        id="iops-string",
    ),
    pytest.param(
        DB,
        storage(type="gp3", iops=3000.5),
        'spec.storage.iops in body must be of type integer: "number"',
        id="iops-fraction",
    ),
    pytest.param(
        DB,
        storage(type="gp3", iops=True),
        'spec.storage.iops in body must be of type integer: "boolean"',
        id="iops-boolean",
    ),
    pytest.param(
        DB,
        storage(sizeGiB=10),
        "spec.storage.sizeGiB in body should be greater than or equal to 20",
        id="size-too-small",
    ),
    pytest.param(
        DB,
        {"storage": [1]},
        'spec.storage in body must be of type object: "array"',
        id="storage-not-object",
    ),
    pytest.param(
        DB,
        storage(type="gp3", throughput=500),
        'unknown field "spec.storage.throughput" (spec.storage has only sizeGiB, type, iops)',
        id="storage-throughput",
    ),
    pytest.param(
        BUCKET,
        storage(type="gp3"),
        'unknown field "spec.storage" (the annotation carries only connectionSecret)',
        id="storage-on-a-bucket",
    ),
    pytest.param(
        DB,
        {"publiclyAccessible": True},
        'unknown field "spec.publiclyAccessible" (the annotation carries only connectionSecret,'
        " storage)",
        id="other-spec-field",
    ),
    pytest.param(
        QUEUE,
        {"x\ny": 1},
        "unknown field in spec (the annotation carries only connectionSecret)",
        id="unknown-name-not-quoted",
    ),
]


@pytest.mark.parametrize(("kind", "fields", "message"), REFUSED)
def test_a_lifted_field_that_breaks_a_v1beta1_rule_is_refused_with_its_message(
    kind: str, fields: Obj, message: str
) -> None:
    body = at_v1alpha1(kind, fields)
    assert refusal(body) == refused_with(kind, message)
    with pytest.raises(ConversionError) as raised:
        convert(body, V1BETA1)
    assert str(raised.value) == f"annotation {FIELDS_ANNOTATION}: {message}"


ACCEPTED = [
    pytest.param(DB, keys(URL="{{ .uri }}?sslmode=require", H="{{.host}}"), id="db-uri"),
    pytest.param(DB, keys(P="{{   .password   }}"), id="db-password-spaces"),
    pytest.param(DB, keys(), id="db-empty-keys"),
    pytest.param(BUCKET, keys(url="s3://{{ .bucket }}/", **{"aws.region": "{{ .region }}"})),
    pytest.param(BUCKET, keys(fixed="no placeholder\nat all"), id="constant-multiline"),
    pytest.param(QUEUE, keys(Q="{{ .queueName }} in {{ .region }}"), id="queue"),
    pytest.param(TOPIC, {"connectionSecret": {"keys": {f"k{i}": "x" * 1024 for i in range(50)}}}),
    pytest.param(DB, storage(type="gp3"), id="gp3"),
    pytest.param(DB, storage(type="gp3", iops=3000), id="gp3-iops"),
    pytest.param(DB, storage(type="io1", iops=1000), id="io1-min"),
    pytest.param(DB, storage(type="io2", iops=256000), id="io2-max"),
    pytest.param(DB, storage(), id="empty-storage"),
    pytest.param(DB, {"connectionSecret": {}, "storage": {"type": "standard"}}, id="both"),
    pytest.param(TOPIC, {}, id="nothing"),
]


@pytest.mark.parametrize(("kind", "fields"), ACCEPTED)
def test_valid_lifted_fields_are_stored_and_read_back_losslessly(kind: str, fields: Obj) -> None:
    body = at_v1alpha1(kind, fields)
    answer = review_response(review([body], V1BETA1, "uid-1"))["response"]
    assert answer["result"] == {"status": "Success"}
    [stored] = answer["convertedObjects"]
    assert FIELDS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    for name, value in fields.items():
        assert stored["spec"][name] == value, name
    # Read back at v1alpha1 and written again: the same object at v1beta1.
    back = convert(stored, V1ALPHA1)
    assert convert(back, V1BETA1) == stored


def test_the_docs_example_reads_at_v1beta1() -> None:
    annotation = (
        '{"connectionSecret":{"keys":{"DATABASE_URL":"{{ .uri }}"}},"storage":{"type":"gp3"}}'
    )
    body = at_v1alpha1(DB, annotation, {"allocatedStorageGiB": 100})
    body["spec"]["writeConnectionSecretToRef"] = {"name": "orders-db"}
    stored = convert(body, V1BETA1)
    assert stored["spec"]["connectionSecret"] == {
        "name": "orders-db",
        "keys": {"DATABASE_URL": "{{ .uri }}"},
    }
    assert stored["spec"]["storage"] == {"sizeGiB": 100, "type": "gp3"}
    assert convert(stored, V1ALPHA1) == body


# The name and the size have v1alpha1 fields, whose v1alpha1 rules (immutable, may only grow)
# see only those fields: the annotation may repeat them but not say otherwise.
@pytest.mark.parametrize(
    ("fields", "spec", "ok"),
    [
        (
            {"connectionSecret": {"name": "orders-db"}},
            {"writeConnectionSecretToRef": {"name": "orders-db"}},
            True,
        ),
        ({"connectionSecret": {"name": "orders-connection"}}, {}, True),
        (
            {"connectionSecret": {"name": "other"}},
            {"writeConnectionSecretToRef": {"name": "orders-db"}},
            False,
        ),
        ({"connectionSecret": {"name": "other"}}, {}, False),
    ],
    ids=["same-as-ref", "same-as-default", "other-than-ref", "other-than-default"],
)
def test_the_secret_name_in_the_annotation_cannot_contradict_v1alpha1(
    fields: Obj, spec: Obj, ok: bool
) -> None:
    body = at_v1alpha1(QUEUE, fields, spec)
    if ok:
        assert convert(body, V1BETA1)["spec"]["connectionSecret"] == fields["connectionSecret"]
        return
    assert refusal(body) == refused_with(
        QUEUE,
        "spec.connectionSecret.name differs from spec.writeConnectionSecretToRef.name"
        " (<metadata.name>-connection when unset), where v1alpha1 sets it",
    )


@pytest.mark.parametrize(
    ("size", "spec", "ok"),
    [
        (30, {"allocatedStorageGiB": 30}, True),
        (20, {"allocatedStorageGiB": 30}, False),
        (20, {}, False),
    ],
    ids=["same", "other", "no-v1alpha1-size"],
)
def test_the_size_in_the_annotation_cannot_contradict_v1alpha1(
    size: int, spec: Obj, ok: bool
) -> None:
    body = at_v1alpha1(DB, storage(sizeGiB=size, type="gp3"), spec)
    if ok:
        assert convert(body, V1BETA1)["spec"]["storage"] == {"sizeGiB": size, "type": "gp3"}
        return
    assert refusal(body) == refused_with(
        DB, "spec.storage.sizeGiB differs from spec.allocatedStorageGiB, where v1alpha1 sets it"
    )


MALFORMED = [
    pytest.param("{", "is not JSON", id="truncated"),
    pytest.param("[" * 100_000 + "]" * 100_000, "is not JSON", id="deeply-nested"),
    pytest.param('{"a":' * 20_000 + "1" + "}" * 20_000, "is not JSON", id="deep-objects"),
    pytest.param('{"storage": {"iops": ' + "9" * 5000 + "}}", "is not JSON", id="huge-number"),
    pytest.param(
        "x" * (MAX_FIELDS_CHARS + 1), f"is longer than {MAX_FIELDS_CHARS} characters", id="huge"
    ),
    pytest.param("[]", "must hold a JSON object", id="array"),
    pytest.param('"connectionSecret"', "must hold a JSON object", id="string"),
    pytest.param("null", "must hold a JSON object", id="null"),
    pytest.param(5, "must be a string", id="not-a-string"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_a_malformed_annotation_is_refused_with_a_message(text: Any, message: str) -> None:
    body = at_v1alpha1(DB, "{}")
    body["metadata"]["annotations"][FIELDS_ANNOTATION] = text
    assert refusal(body) == f"{DB} team/orders: annotation {FIELDS_ANNOTATION} {message}"


def nested(depth: int) -> Obj:
    """An object `depth` maps deep (no JSON parser would have built it)."""
    value: Obj = {}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (None, "not a ConversionReview: no request"),
        ({"objects": "x"}, "request.objects must be a list"),
        (
            {"objects": [1], "desiredAPIVersion": V1BETA1},
            "request.objects: an object must be a JSON object",
        ),
        ({"objects": [], "desiredAPIVersion": 5}, "request.desiredAPIVersion must be a string"),
        (
            {
                "desiredAPIVersion": V1BETA1,
                "objects": [
                    {
                        "apiVersion": f"{GROUP}/{V1ALPHA1}",
                        "kind": QUEUE,
                        "metadata": {"name": "q", "namespace": "n"},
                        "spec": {"x": nested(5000)},
                    }
                ],
            },
            f"{QUEUE} n/q: not an object of this API",
        ),
        (
            {"desiredAPIVersion": V1BETA1, "objects": [{"apiVersion": 1, "kind": "x" * 300}]},
            '? /: apiVersion "1" is not one of',
        ),
    ],
    ids=[
        "no-request",
        "objects-not-list",
        "object-not-dict",
        "version-not-string",
        "annotations-list",
        "junk",
    ],
)
def test_a_malformed_review_fails_with_a_message_not_a_trace(request_: Any, message: str) -> None:
    answer = review_response({"request": request_} if request_ is not None else [])
    result = answer["response"]["result"]
    assert answer["response"]["convertedObjects"] == []
    assert result["status"] == "Failure" and message in result["message"], result


def test_the_largest_hostile_values_are_checked_at_once() -> None:
    """Lengths come before patterns, and the patterns never backtrack on these: the checks
    take time in proportion to the value, which the API server bounds (256 KiB)."""
    near_misses = {
        # Almost placeholders, over and over, each failing at its last character.
        "A": "{{ .bucket }" * 85,
        "B": "{{ .bucket }}" * 78 + "{",
        "C": "{{ " + " " * 1000 + ".x",
        "D": "x" * 1023 + "}",
    }
    bodies = [
        at_v1alpha1(
            BUCKET, keys(**{f"{k}{i}": t for i in range(12) for k, t in near_misses.items()})
        ),
        at_v1alpha1(BUCKET, {"connectionSecret": {"name": "a-" * 126 + "-"}}),
        at_v1alpha1(BUCKET, {"connectionSecret": {"name": ("a" + "-" * 60 + ".") * 4 + "_"}}),
        at_v1alpha1(DB, keys(**{f"k{i}": "{{ .passwor }}" * 70 for i in range(50)})),
    ]
    started = time.monotonic()
    for body in bodies:
        refusal(body)
    # Well above what they take (milliseconds), far below what backtracking would.
    assert time.monotonic() - started < 2.0
