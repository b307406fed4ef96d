"""v1beta1's rules hold for what a v1alpha1 write carries in its annotation.

The API server checks a v1alpha1 write against v1alpha1's schema, where the annotation
`cloud.provisioner.dev/v1beta1-fields` is a string like any other, and stores the object at
v1beta1 through the conversion webhook (the session's `provisioner webhook`, serving this
code). So the webhook applies v1beta1's rules to what it lifts out of the annotation: a tenant
who may write the kinds in its namespace (impersonated here) cannot store at v1alpha1 what
v1beta1 refuses, and reads the same message either way. What v1beta1 takes still travels
through v1alpha1 and works.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import assert_refused, get, secret_data, wait_for, wait_ready

pytestmark = pytest.mark.e2e

GROUP = "cloud.provisioner.dev"
FIELDS = f"{GROUP}/v1beta1-fields"
DB, BUCKET, QUEUE = "DatabaseInstance", "S3Bucket", "Queue"
PLURALS = {DB: "databaseinstances", BUCKET: "s3buckets", QUEUE: "queues", "Topic": "topics"}
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DB_SPEC = {"engine": "postgres", "instanceClass": "db.t3.micro", "deletionPolicy": "Delete"}

Kubectl = Callable[..., Any]


@pytest.fixture
def tenant(kube: Any, namespace: str) -> Kubectl:
    """kubectl as `system:serviceaccount:<namespace>:tenant`, who may write the kinds in its
    namespace and nothing else (what the chart's roles give `edit`)."""
    who = f"system:serviceaccount:{namespace}:tenant"
    resources = ",".join(PLURALS.values())
    kube.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
    kube.kubectl(
        "create", "role", "cloud-edit", "-n", namespace, f"--resource={resources}",
        "--verb=get,list,watch,create,update,patch,delete",
    )  # fmt: skip
    kube.kubectl(
        "create", "rolebinding", "tenant", "-n", namespace, "--role=cloud-edit",
        f"--serviceaccount={namespace}:tenant",
    )  # fmt: skip

    def can_create() -> bool:
        found = kube.kubectl(
            "auth", "can-i", "create", f"s3buckets.{GROUP}", f"--as={who}", "-n", namespace,
            check=False,
        )  # fmt: skip
        return found.stdout.strip() == "yes"

    wait_for(can_create, what="the tenant's Role to take effect")

    def run(*args: str, input: str | None = None) -> Any:
        return kube.kubectl(f"--as={who}", "-n", namespace, *args, input=input, check=False)

    return run


def manifest(kind: str, name: str, spec: dict[str, Any], fields: Any, version: str) -> str:
    """The object at `version`; at v1alpha1 `fields` go to the annotation (as JSON unless
    already a string), at v1beta1 into the spec."""
    spec = (DB_SPEC if kind == DB else {}) | spec
    metadata: dict[str, Any] = {"name": name}
    if version == "v1alpha1":
        text = fields if isinstance(fields, str) else json.dumps(fields)
        metadata["annotations"] = {FIELDS: text}
    else:
        spec = spec | fields
    body = {"apiVersion": f"{GROUP}/{version}", "kind": kind, "metadata": metadata, "spec": spec}
    return json.dumps(body)


def only(*values: str) -> str:
    return "spec.connectionSecret.keys: a template may name only " + ", ".join(
        "{{ ." + v + " }}" for v in values
    )


# What a tenant stored at v1alpha1 unchecked, and the message v1beta1 refuses it with.
ATTACKS = [
    pytest.param(
        BUCKET,
        {"connectionSecret": {"keys": {"LEAK": "{{ .password }}"}}},
        only("bucket", "region", "arn", "endpoint"),
        id="bucket-template-naming-the-password",
    ),
    pytest.param(
        BUCKET,
        {"connectionSecret": {"name": "Not_A/Valid..Name"}},
        f"spec.connectionSecret.name in body should match '{NAME_PATTERN}'",
        id="invalid-secret-name",
    ),
    pytest.param(
        DB,
        {"connectionSecret": {"keys": {"PGHOST": "{{ .host }}", "PGUSER": "{{ .username }}"}}},
        "spec.connectionSecret.keys: at least one template must name {{ .password }} or"
        " {{ .uri }}: the operator keeps the master password only in this Secret",
        id="database-templates-without-the-password",
    ),
    pytest.param(
        DB,
        {"storage": {"type": "io1"}},
        "spec.storage.type io1 and io2 need spec.storage.iops",
        id="io1-without-iops",
    ),
]


@pytest.mark.parametrize(("kind", "fields", "message"), ATTACKS)
def test_v1alpha1_cannot_store_what_v1beta1_refuses(
    kube: Any, namespace: str, tenant: Kubectl, kind: str, fields: dict[str, Any], message: str
) -> None:
    # At v1beta1, the CRD's own rule refuses it ...
    direct = tenant(
        "apply", "--dry-run=server", "-f", "-", input=manifest(kind, "x", {}, fields, "v1beta1")
    )
    assert_refused(direct, message)

    # ... and at v1alpha1, the conversion, with the same message.
    lifted = tenant("apply", "-f", "-", input=manifest(kind, "x", {}, fields, "v1alpha1"))
    assert_refused(lifted, message)
    assert FIELDS in lifted.stderr and f"{kind} {namespace}/x" in lifted.stderr
    assert "Traceback" not in lifted.stderr
    print(f"\nkubectl apply at v1alpha1 ({kind}):\n{lifted.stderr.strip()}")
    assert get(kube, PLURALS[kind], namespace, "x") is None


def test_an_update_at_v1alpha1_is_checked_too(kube: Any, namespace: str, tenant: Kubectl) -> None:
    good = {"connectionSecret": {"keys": {"URL": "{{ .uri }}"}}, "storage": {"type": "gp3"}}
    created = tenant("apply", "-f", "-", input=manifest(DB, "orders", {}, good, "v1alpha1"))
    assert created.returncode == 0, created.stderr
    before = get(kube, PLURALS[DB], namespace, "orders")
    assert before is not None

    bad = {"connectionSecret": {"keys": {"URL": "{{ .uri }}"}}, "storage": {"type": "io2"}}
    changed = tenant("apply", "-f", "-", input=manifest(DB, "orders", {}, bad, "v1alpha1"))
    assert_refused(changed, "spec.storage.type io1 and io2 need spec.storage.iops")
    patched = tenant(
        "patch", f"{PLURALS[DB]}.v1alpha1.{GROUP}", "orders", "--type=merge", "-p",
        json.dumps({"metadata": {"annotations": {FIELDS: '{"storage": {"iops": 3000}}'}}}),
    )  # fmt: skip
    assert_refused(patched, "spec.storage.iops needs spec.storage.type io1, io2 or gp3")

    after = get(kube, PLURALS[DB], namespace, "orders")
    assert after is not None
    # The operator writes status and its finalizer meanwhile: the spec is what must not move.
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    assert after["spec"]["storage"] == {"sizeGiB": 20, "type": "gp3"}


def test_the_secret_name_cannot_change_through_the_annotation(
    kube: Any, namespace: str, tenant: Kubectl
) -> None:
    # v1alpha1's rule keeps writeConnectionSecretToRef.name (or its default) as it was; the
    # annotation may not name another Secret behind its back.
    created = tenant("apply", "-f", "-", input=manifest(QUEUE, "jobs", {}, {}, "v1alpha1"))
    assert created.returncode == 0, created.stderr
    renamed = {"connectionSecret": {"name": "elsewhere"}}
    changed = tenant("apply", "-f", "-", input=manifest(QUEUE, "jobs", {}, renamed, "v1alpha1"))
    assert_refused(changed, "spec.connectionSecret.name differs from")
    stored = get(kube, PLURALS[QUEUE], namespace, "jobs")
    assert stored is not None and "connectionSecret" not in stored["spec"]


def keys(**templates: Any) -> dict[str, Any]:
    return {"connectionSecret": {"keys": templates}}


def storage(**fields: Any) -> dict[str, Any]:
    return {"storage": fields}


# Every kind of schema constraint: what the API server says at v1beta1 (its words, but for
# the value, which a refused conversion never repeats) the conversion says at v1alpha1.
SCHEMA = [
    pytest.param(
        BUCKET,
        keys(X="x" * 1025),
        ["spec.connectionSecret.keys.X: Too long: may not be more than 1024 bytes"],
        id="max-length",
    ),
    pytest.param(
        BUCKET,
        keys(X=7),
        ['spec.connectionSecret.keys.X in body must be of type string: "integer"'],
        id="type",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"keys": {f"k{i}": "x" for i in range(51)}}},
        ["spec.connectionSecret.keys: Too many: 51: must have at most 50 items"],
        id="max-properties",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": ""}},
        ["spec.connectionSecret.name in body should be at least 1 chars long"],
        id="min-length",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": {"name": "a" * 254}},
        ["spec.connectionSecret.name: Too long: may not be more than 253 bytes"],
        id="name-max-length",
    ),
    pytest.param(
        QUEUE,
        {"connectionSecret": "x"},
        ['spec.connectionSecret in body must be of type object: "string"'],
        id="object-type",
    ),
    pytest.param(
        QUEUE,
        keys(**{"a/b": "x"}),
        ["spec.connectionSecret.keys: a key is 1 to 253 of a-z, A-Z, 0-9, '-', '_' and '.'"],
        id="key-rule",
    ),
    pytest.param(
        DB,
        storage(type="sc1"),
        [
            "spec.storage.type: Unsupported value: ",
            'supported values: "gp2", "gp3", "io1", "io2", "standard"',
        ],
        id="enum",
    ),
    pytest.param(
        DB,
        storage(type="io1", iops=999),
        ["spec.storage.iops in body should be greater than or equal to 1000"],
        id="minimum",
    ),
    pytest.param(
        DB,
        storage(type="io2", iops=256001),
        ["spec.storage.iops in body should be less than or equal to 256000"],
        id="maximum",
    ),
    pytest.param(
        DB,
        storage(type="gp3", iops="3000"),
        ['spec.storage.iops in body must be of type integer: "string"'],
        id="integer-type",
    ),
    pytest.param(
        DB,
        storage(type="gp2", iops=3000),
        ["spec.storage.iops needs spec.storage.type io1, io2 or gp3"],
        id="iops-rule",
    ),
    pytest.param(
        DB,
        storage(type="gp3", throughput=500),
        ['unknown field "spec.storage.throughput"'],
        id="unknown-field",
    ),
]


@pytest.mark.parametrize(("kind", "fields", "said"), SCHEMA)
def test_the_conversion_says_what_the_api_server_says_at_v1beta1(
    kube: Any, namespace: str, kind: str, fields: dict[str, Any], said: list[str]
) -> None:
    def apply(version: str, *flags: str) -> Any:
        body = manifest(kind, "x", {}, fields, version)
        return kube.kubectl("apply", *flags, "-n", namespace, "-f", "-", input=body, check=False)

    direct, lifted = apply("v1beta1", "--dry-run=server"), apply("v1alpha1")
    for words in said:
        assert_refused(direct, words)
        assert_refused(lifted, words)
    assert FIELDS in lifted.stderr
    assert get(kube, PLURALS[kind], namespace, "x") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('{"connectionSecret": {"keys": ', "is not JSON", id="not-json"),
        pytest.param("[" * 5000 + "]" * 5000, "is not JSON", id="deeply-nested"),
        pytest.param('["connectionSecret"]', "must hold a JSON object", id="not-an-object"),
        pytest.param(
            '{"connectionSecret": {"keys": {"A": 1}}}',
            'spec.connectionSecret.keys.A in body must be of type string: "integer"',
            id="wrong-type",
        ),
    ],
)
def test_a_malformed_annotation_is_refused_with_a_message(
    namespace: str, tenant: Kubectl, text: str, message: str
) -> None:
    result = tenant("apply", "-f", "-", input=manifest(BUCKET, "x", {}, text, "v1alpha1"))
    assert_refused(result, f"{FIELDS} {message}" if " in body " not in message else message)
    assert "Traceback" not in result.stderr


def test_v1beta1_fields_written_at_v1alpha1_still_work(
    kube: Any, operator: Any, namespace: str, tenant: Kubectl
) -> None:
    templates = {"BUCKET_URL": "s3://{{ .bucket }}/", "AWS_REGION": "{{ .region }}"}
    fields = {"connectionSecret": {"keys": templates}}
    spec = {"writeConnectionSecretToRef": {"name": "files-env"}}
    written = tenant("apply", "-f", "-", input=manifest(BUCKET, "files", spec, fields, "v1alpha1"))
    assert written.returncode == 0, written.stderr

    stored = get(kube, PLURALS[BUCKET], namespace, "files")  # read at v1beta1
    assert stored is not None
    assert stored["spec"]["connectionSecret"] == {"name": "files-env", "keys": templates}
    assert FIELDS not in (stored["metadata"].get("annotations") or {})
    old = tenant("get", f"{PLURALS[BUCKET]}.v1alpha1.{GROUP}", "files", "-o", "json")
    assert json.loads(json.loads(old.stdout)["metadata"]["annotations"][FIELDS]) == fields

    ready = wait_ready(kube, "s3bucket", namespace, "files")
    data = wait_for(lambda: secret_data(kube, namespace, "files-env"), what="the Secret")
    bucket = ready["status"]["externalName"]
    assert data == {"BUCKET_URL": f"s3://{bucket}/", "AWS_REGION": ready["status"]["region"]}

    # A database's storage type and IOPS, through v1alpha1 too (server-side dry run).
    storage = {"storage": {"type": "io1", "iops": 3000}}
    db = tenant(
        "apply", "--dry-run=server", "-o", "json", "-f", "-",
        input=manifest(DB, "orders", {"allocatedStorageGiB": 100}, storage, "v1alpha1"),
    )  # fmt: skip
    assert db.returncode == 0, db.stderr
    answered = json.loads(db.stdout)  # stored at v1beta1, answered at v1alpha1
    assert json.loads(answered["metadata"]["annotations"][FIELDS]) == storage
    assert answered["spec"]["allocatedStorageGiB"] == 100
