"""v1beta1's own rules, checked by the API server at apply time: the connection Secret's
templates (spec.connectionSecret.keys) and a DatabaseInstance's spec.storage.

Every object here is written at v1beta1, the storage version, so no conversion (and no
webhook) is involved; most cases are server-side dry runs, the updates create the object
first. No operator needs to run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.helpers import assert_refused, try_apply

pytestmark = pytest.mark.e2e

API_VERSION = "cloud.provisioner.dev/v1beta1"
DB, BUCKET, QUEUE, TOPIC = "DatabaseInstance", "S3Bucket", "Queue", "Topic"
DRY_RUN = "--dry-run=server"

VALUES = {
    DB: ("host", "port", "username", "password", "database", "engine", "arn", "uri"),
    BUCKET: ("bucket", "region", "arn", "endpoint"),
    QUEUE: ("queueUrl", "queueArn", "queueName", "region"),
    TOPIC: ("topicArn", "topicName", "region"),
}
ONLY = {
    kind: "spec.connectionSecret.keys: a template may name only "
    + ", ".join(f"{{{{ .{v} }}}}" for v in values)
    for kind, values in VALUES.items()
}
PASSWORD = "at least one template must name {{ .password }} or {{ .uri }}"


def manifest(kind: str, name: str, spec: dict[str, Any]) -> str:
    if kind == DB:
        spec = {"engine": "postgres", "instanceClass": "db.t3.micro", **spec}
    body = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
    return yaml.safe_dump(body)


def keys(**templates: str) -> dict[str, Any]:
    return {"connectionSecret": {"keys": templates}}


ACCEPTED = [
    pytest.param(
        DB,
        keys(DATABASE_URL="{{ .uri }}", HOST="{{.host}}", PORT="{{   .port   }}"),
        id="db-templates",
    ),
    pytest.param(
        DB,
        keys(dsn="{{ .engine }}://{{ .username }}:{{ .password }}@{{ .host }}:{{ .port }}/x"),
        id="db-password-inside-text",
    ),
    pytest.param(DB, {"connectionSecret": {"keys": {}}}, id="db-empty-keys"),
    pytest.param(
        BUCKET,
        keys(url="s3://{{ .bucket }}/", **{"aws.region": "{{ .region }}", "ARN": "{{ .arn }}"}),
        id="bucket-templates",
    ),
    pytest.param(BUCKET, keys(fixed="no placeholder at all"), id="bucket-constant"),
    pytest.param(
        QUEUE,
        keys(QUEUE_URL="{{ .queueUrl }}", QUEUE="{{ .queueName }} in {{ .region }}"),
        id="queue-templates",
    ),
    pytest.param(TOPIC, keys(TOPIC_ARN="{{ .topicArn }}"), id="topic-templates"),
    pytest.param(
        BUCKET,
        {"connectionSecret": {"name": "files", "keys": {"B": "{{ .bucket }}"}}},
        id="name-and-keys",
    ),
    pytest.param(DB, {"storage": {"sizeGiB": 100, "type": "gp3", "iops": 3000}}, id="gp3-iops"),
    pytest.param(DB, {"storage": {"type": "io1", "iops": 1000}}, id="io1-iops"),
    pytest.param(DB, {"storage": {"type": "io2", "iops": 256000}}, id="io2-iops"),
    pytest.param(DB, {"storage": {"type": "gp2"}}, id="gp2"),
    pytest.param(DB, {"storage": {"type": "standard", "sizeGiB": 65536}}, id="standard-max"),
]


@pytest.mark.parametrize(("kind", "spec"), ACCEPTED)
def test_valid_v1beta1_spec_is_accepted(kube: Any, namespace: str, kind: str, spec: dict) -> None:
    result = try_apply(kube, namespace, manifest(kind, "good", spec), DRY_RUN)
    assert result.returncode == 0, result.stderr


# (kind, spec, a substring of kubectl's error)
REFUSED = [
    *(
        pytest.param(kind, keys(X=f"{{{{ .{unknown} }}}}"), ONLY[kind], id=f"{kind}-unknown")
        for kind, unknown in ((DB, "bucket"), (BUCKET, "host"), (QUEUE, "topicArn"), (TOPIC, "uri"))
    ),
    pytest.param(BUCKET, keys(X="{{ .bucket }}", Y="{{ .Bucket }}"), ONLY[BUCKET], id="case"),
    pytest.param(BUCKET, keys(X="{ .bucket }"), ONLY[BUCKET], id="single-braces"),
    pytest.param(BUCKET, keys(X="{{ bucket }}"), ONLY[BUCKET], id="no-dot"),
    pytest.param(QUEUE, keys(X="{{ .queueUrl }"), ONLY[QUEUE], id="unclosed"),
    pytest.param(TOPIC, keys(X="{{ .topicArn | upper }}"), ONLY[TOPIC], id="pipeline"),
    pytest.param(BUCKET, keys(**{"a/b": "{{ .bucket }}"}), "a key is 1 to 253", id="key-slash"),
    pytest.param(BUCKET, keys(**{"k" * 254: "x"}), "a key is 1 to 253", id="key-too-long"),
    pytest.param(BUCKET, keys(X="x" * 1025), "spec.connectionSecret.keys", id="template-long"),
    pytest.param(
        BUCKET,
        {"connectionSecret": {"keys": {f"k{i}": "x" for i in range(51)}}},
        "spec.connectionSecret.keys",
        id="too-many-keys",
    ),
    pytest.param(
        BUCKET, {"connectionSecret": {"name": "Bad_Name"}}, "spec.connectionSecret.name", id="name"
    ),
    pytest.param(DB, keys(HOST="{{ .host }}", PORT="{{ .port }}"), PASSWORD, id="db-no-password"),
    pytest.param(
        DB,
        {"storage": {"iops": 3000}},
        "spec.storage.iops needs spec.storage.type io1, io2 or gp3",
        id="iops-without-type",
    ),
    pytest.param(
        DB,
        {"storage": {"type": "gp2", "iops": 3000}},
        "spec.storage.iops needs spec.storage.type io1, io2 or gp3",
        id="iops-with-gp2",
    ),
    pytest.param(
        DB,
        {"storage": {"type": "io1"}},
        "spec.storage.type io1 and io2 need spec.storage.iops",
        id="io1-without-iops",
    ),
    pytest.param(
        DB,
        {"storage": {"type": "io2", "iops": 999}},
        "spec.storage.iops",
        id="iops-too-low",
    ),
    pytest.param(DB, {"storage": {"type": "sc1"}}, "spec.storage.type", id="type-enum"),
    pytest.param(DB, {"storage": {"sizeGiB": 10}}, "spec.storage.sizeGiB", id="size-too-small"),
    pytest.param(DB, {"storage": {"sizeGiB": 65537}}, "spec.storage.sizeGiB", id="size-too-big"),
    pytest.param(
        DB, {"allocatedStorageGiB": 20}, 'unknown field "spec.allocatedStorageGiB"', id="old-size"
    ),
    pytest.param(
        BUCKET,
        {"writeConnectionSecretToRef": {"name": "x"}},
        'unknown field "spec.writeConnectionSecretToRef"',
        id="old-secret-ref",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "expected"), REFUSED)
def test_invalid_v1beta1_spec_is_refused(
    kube: Any, namespace: str, kind: str, spec: dict[str, Any], expected: str
) -> None:
    result = try_apply(kube, namespace, manifest(kind, "bad", spec), DRY_RUN)

    assert_refused(result, expected)


def test_storage_defaults_to_20_gib_of_the_clouds_type(kube: Any, namespace: str) -> None:
    result = try_apply(kube, namespace, manifest(DB, "plain", {}), DRY_RUN, "-o", "json")
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)["spec"]
    assert spec["storage"] == {"sizeGiB": 20}
    assert "connectionSecret" not in spec


# (kind, the spec it is created with, the spec it is changed to, the error or None: accepted)
UPDATES = [
    pytest.param(
        DB,
        {"storage": {"sizeGiB": 50}},
        {"storage": {"sizeGiB": 40}},
        "spec.storage.sizeGiB may grow but never shrink",
        id="storage-shrink",
    ),
    pytest.param(
        DB,
        {"storage": {"sizeGiB": 50}},
        {"storage": {"sizeGiB": 80, "type": "gp3", "iops": 3000}},
        None,
        id="storage-grows",
    ),
    pytest.param(
        BUCKET,
        {"connectionSecret": {"name": "first"}},
        {"connectionSecret": {"name": "second"}},
        "spec.connectionSecret.name is immutable",
        id="secret-name-change",
    ),
    pytest.param(
        QUEUE,
        {},
        {"connectionSecret": {"name": "elsewhere"}},
        "spec.connectionSecret.name is immutable",
        id="secret-name-added",
    ),
    pytest.param(
        TOPIC,
        {"connectionSecret": {"keys": {"ARN": "{{ .topicArn }}"}}},
        {"connectionSecret": {"name": "subject-connection", "keys": {"T": "{{ .topicName }}"}}},
        None,
        id="templates-change-default-name-made-explicit",
    ),
]


@pytest.mark.parametrize(("kind", "before", "after", "expected"), UPDATES)
def test_v1beta1_update(
    kube: Any,
    namespace: str,
    kind: str,
    before: dict[str, Any],
    after: dict[str, Any],
    expected: str | None,
) -> None:
    created = try_apply(kube, namespace, manifest(kind, "subject", before))
    assert created.returncode == 0, created.stderr
    try:
        result = try_apply(kube, namespace, manifest(kind, "subject", after), DRY_RUN)
        if expected is None:
            assert result.returncode == 0, result.stderr
        else:
            assert_refused(result, expected)
    finally:
        kube.kubectl("delete", kind.lower(), "subject", "-n", namespace, "--wait=false")
