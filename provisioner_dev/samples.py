"""One sample of every registered kind, for the demo, the tests, the benchmark and the soak.

Specs are spelled as v1beta1 (the version the tools write). Each sample has a spec that goes
Ready on moto, a spec change and how to see that change in
the cloud, and specs the API server refuses. A kind registered in `kinds.registry` without
a sample here fails at import, so no tool silently leaves a new kind out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provisioner.kinds.registry import KINDS

# (a DevCloud, the CR's status, the changed value) -> whether the cloud shows the change.
Check = Callable[[Any, dict[str, Any], Any], bool]


@dataclass(frozen=True)
class Sample:
    kind: str
    spec: dict[str, Any]
    # The one field the benchmark and the soak change, and how a value for it is made.
    change_field: str
    change_value: Callable[[int], Any]
    # Whether the cloud shows `value` in that field.
    shows: Check
    # Specs the API server refuses (schema or CEL): nothing may be created for them.
    invalid: tuple[str, ...] = field(default=())

    def change(self, i: int) -> tuple[dict[str, Any], Any]:
        """The merge patch of the i-th change, and the value it sets."""
        value = self.change_value(i)
        return {"spec": {self.change_field: value}}, value


def _db_shows(cloud: Any, status: dict[str, Any], value: Any) -> bool:
    found = cloud.client("rds").describe_db_instances(
        DBInstanceIdentifier=status.get("externalName", "")
    )["DBInstances"][0]
    pending = found.get("PendingModifiedValues") or {}
    return value in (found.get("BackupRetentionPeriod"), pending.get("BackupRetentionPeriod"))


def _bucket_shows(cloud: Any, status: dict[str, Any], value: Any) -> bool:
    answer = cloud.client("s3").get_bucket_versioning(Bucket=status.get("externalName", ""))
    return (answer.get("Status") == "Enabled") == bool(value)


def _queue_shows(cloud: Any, status: dict[str, Any], value: Any) -> bool:
    sqs = cloud.client("sqs")
    url = status.get("queueUrl") or sqs.get_queue_url(QueueName=status["externalName"])["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    return attrs["Attributes"].get("VisibilityTimeout") == str(value)


def _topic_shows(cloud: Any, status: dict[str, Any], value: Any) -> bool:
    attrs = cloud.client("sns").get_topic_attributes(TopicArn=status.get("arn", ""))
    return attrs["Attributes"].get("DisplayName") == value


SAMPLES: dict[str, Sample] = {
    s.kind: s
    for s in (
        Sample(
            "DatabaseInstance",
            {"engine": "postgres", "instanceClass": "db.t3.micro", "storage": {"sizeGiB": 20}},
            "backupRetentionDays",
            lambda i: 8 + i % 28,
            _db_shows,
            invalid=(
                "{engine: oracle, instanceClass: db.t3.micro}",
                "{engine: postgres, instanceClass: db.t3.micro, storage: {sizeGiB: 5}}",
                "{engine: postgres, instanceClass: huge}",
            ),
        ),
        Sample(
            "S3Bucket",
            {},
            "versioning",
            lambda i: True,
            _bucket_shows,
            invalid=(
                "{bucketName: Not_Valid}",
                "{encryption: rot13}",
                '{tags: {"provisioner.dev/owner-uid": stolen}}',
            ),
        ),
        Sample(
            "Queue",
            {"visibilityTimeoutSeconds": 30},
            "visibilityTimeoutSeconds",
            lambda i: 31 + i % 600,
            _queue_shows,
            invalid=(
                "{visibilityTimeoutSeconds: 99999}",
                "{fifo: true, queueName: plain}",
                "{deadLetter: {maxReceiveCount: 5000, queueRef: {name: x}}}",
                "{delaySeconds: -1}",
            ),
        ),
        Sample(
            "Topic",
            {"displayName": "sample"},
            "displayName",
            lambda i: f"changed {i}",
            _topic_shows,
            invalid=(
                "{fifo: true, topicName: plain}",
                "{topicName: 'not valid'}",
                "{displayName: " + "x" * 101 + "}",
            ),
        ),
    )
}

_missing = [k.kind for k in KINDS if k.kind not in SAMPLES]
if _missing:
    raise ImportError(
        f"provisioner_dev/samples.py has no sample of {', '.join(_missing)}: add one, so that "
        "the demo, the tests, the benchmark and the soak cover every kind"
    )
