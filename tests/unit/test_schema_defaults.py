"""A spec recorded by an earlier release, read as the API server serves it now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from provisioner.model import schema_defaults
from provisioner.reconciler.requested import last_handled_spec, requested_fields

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def installed():
    for name in ("queues", "s3buckets", "databaseinstances"):
        crd = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
        schema_defaults.remember(crd, "v1beta1")
    yield
    schema_defaults.forget()


SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "default": 1},
        "b": {
            "type": "object",
            "default": {},
            "properties": {"c": {"type": "string", "default": "x"}},
        },
        "rules": {
            "type": "array",
            "items": {"type": "object", "properties": {"d": {"type": "integer", "default": 2}}},
        },
        "tags": {
            "type": "object",
            "additionalProperties": {"type": "object", "properties": {"e": {"default": 3}}},
        },
    },
}


def test_defaults_fill_what_is_absent_at_every_depth():
    value = {"rules": [{}, {"d": 5}], "tags": {"k": {}}}
    out = schema_defaults.with_defaults(value, SCHEMA)
    assert out == {
        "a": 1,
        "b": {"c": "x"},  # a default is itself defaulted
        "rules": [{"d": 2}, {"d": 5}],
        "tags": {"k": {"e": 3}},
    }
    assert value == {"rules": [{}, {"d": 5}], "tags": {"k": {}}}  # not mutated


def test_a_value_set_is_kept():
    assert schema_defaults.with_defaults({"a": 7, "b": {"c": "y"}}, SCHEMA) == {
        "a": 7,
        "b": {"c": "y"},
    }


def test_a_queue_of_an_earlier_release_reads_as_the_api_server_serves_it():
    """What the API server returned for a queue made by the release before the queue's
    encryption, FIFO and size fields (read back in tests/e2e/test_upgrade.py)."""
    recorded = {"spec": {"deletionPolicy": "Delete", "visibilityTimeoutSeconds": 45}}
    served = {
        "delaySeconds": 0,
        "deletionPolicy": "Delete",
        "encryption": {"type": "SQS"},
        "fifo": False,
        "maximumMessageSizeBytes": 262144,
        "messageRetentionSeconds": 345600,
        "receiveWaitTimeSeconds": 0,
        "visibilityTimeoutSeconds": 45,
    }
    assert schema_defaults.last_handled_at_hub(recorded, "Queue")["spec"] == served
    body = {
        "kind": "Queue",
        "spec": served,
        "status": {"kopf": {"lastHandledConfiguration": json.dumps(recorded)}},
    }
    assert last_handled_spec(body) == served
    assert requested_fields(last_handled_spec(body), served).paths == frozenset()


def test_a_v1alpha1_record_is_converted_then_defaulted():
    recorded = {
        "spec": {"versioning": True, "writeConnectionSecretToRef": {"name": "assets-connection"}}
    }
    spec = schema_defaults.last_handled_at_hub(recorded, "S3Bucket")["spec"]
    assert spec["connectionSecret"] == {"name": "assets-connection"}
    assert spec["bucketKeyEnabled"] is True
    assert "writeConnectionSecretToRef" not in spec


def test_a_field_the_user_set_differently_is_still_requested():
    recorded = {"spec": {"visibilityTimeoutSeconds": 45}}
    now = schema_defaults.last_handled_at_hub(recorded, "Queue")["spec"]
    now = {**now, "receiveWaitTimeSeconds": 20}
    body = {"kind": "Queue", "status": {"kopf": {"lastHandledConfiguration": json.dumps(recorded)}}}
    assert requested_fields(last_handled_spec(body), now).paths == {"spec.receiveWaitTimeSeconds"}


def test_without_the_crd_nothing_is_filled_in():
    schema_defaults.forget()
    recorded = {"spec": {"visibilityTimeoutSeconds": 45}}
    assert schema_defaults.last_handled_at_hub(recorded, "Queue")["spec"] == {
        "visibilityTimeoutSeconds": 45
    }


def test_a_crd_without_the_version_is_not_remembered():
    schema_defaults.forget()
    crd = yaml.safe_load((ROOT / "crds" / "queues.yaml").read_text())
    schema_defaults.remember(crd, "v9")
    assert schema_defaults.spec_with_defaults("Queue", {}) == {}
