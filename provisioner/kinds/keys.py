"""Customer managed KMS keys of queues and topics: what their key policies must allow.

The operator names a key (`Queue.spec.encryption.kmsKeyId`, `Topic.spec.kmsKeyId`) and never
manages it, so it cannot make SNS able to use it. Where a subscription needs that, the
resource's `status.kmsKeyPolicy` says what the key policy must allow (AWS: "Key management",
https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html):

- a queue encrypted with a KMS key that subscribes to topics: SNS encrypts what it delivers
  with the queue's key, so the key policy must allow the service principal
  `sns.amazonaws.com` `kms:GenerateDataKey` and `kms:Decrypt`;
- a topic encrypted with a KMS key: whoever publishes needs `kms:GenerateDataKey*` and
  `kms:Decrypt` on it (an AWS service that publishes, such as S3 event notifications, through
  the key policy, for its service principal); SNS decrypts before it delivers, so
  subscribers need nothing from it.

- a bucket whose event notifications go to a queue or topic encrypted with a KMS key: S3
  encrypts what it sends with the target's key, so that key's policy must allow the service
  principal `s3.amazonaws.com` `kms:GenerateDataKey` and `kms:Decrypt` (AWS: "Granting
  permissions to publish event notification messages to a destination",
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/grant-destinations-permissions-to-s3.html);
  the bucket's `status.kmsKeyPolicy` says so.

An AWS managed key (`alias/aws/sqs`, `alias/aws/sns`) has a policy nobody can change: SNS,
and AWS services that publish, cannot be allowed to use it.
"""

from __future__ import annotations

DOCS = "https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html"
# The status field that carries the note (absent when nothing is needed).
STATUS_FIELD = "kmsKeyPolicy"


def aws_managed(key: str) -> bool:
    """An AWS managed key named by its alias (`alias/aws/sqs`, or the alias's ARN)."""
    return key.startswith("alias/aws/") or ":alias/aws/" in key


def queue_note(key: str, topics: int) -> str | None:
    """What the key policy of a queue's KMS key must allow for its `topics` subscriptions."""
    if not key or not topics:
        return None
    if aws_managed(key):
        return (
            f"SNS cannot deliver to this queue: it is encrypted with the AWS managed key {key}, "
            "whose key policy cannot be changed to allow sns.amazonaws.com; use a customer "
            "managed key whose key policy allows sns.amazonaws.com kms:GenerateDataKey and "
            f"kms:Decrypt, or spec.encryption.type SQS ({DOCS})"
        )
    return (
        f"the key policy of {key} must allow the service principal sns.amazonaws.com "
        "kms:GenerateDataKey and kms:Decrypt, or SNS cannot deliver the subscribed topics' "
        f"messages to this queue; the operator does not manage the key ({DOCS})"
    )


def topic_note(key: str) -> str | None:
    """What the key policy of a topic's KMS key must allow its publishers."""
    if not key:
        return None
    if aws_managed(key):
        return (
            f"this topic is encrypted with the AWS managed key {key}: principals of this "
            "account may publish, but AWS services that publish (S3 event notifications, "
            "CloudWatch alarms, ...) cannot, since its key policy cannot allow them; use a "
            f"customer managed key for those ({DOCS})"
        )
    return (
        f"publishers need kms:GenerateDataKey* and kms:Decrypt on {key}: an AWS service that "
        "publishes (S3 event notifications, ...) through the key policy, for its service "
        "principal; SNS decrypts before delivering, so subscribers need nothing from it; the "
        f"operator does not manage the key ({DOCS})"
    )


S3_DOCS = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/grant-destinations-permissions-to-s3.html"


def notification_note(target_keys: dict[str, str]) -> str | None:
    """What the key policies of a bucket's encrypted notification targets must allow S3
    (target ARN -> its KMS key)."""
    if not target_keys:
        return None
    notes = []
    for arn, key in sorted(target_keys.items()):
        if aws_managed(key):
            notes.append(
                f"S3 cannot send to {arn}: it is encrypted with the AWS managed key {key}, "
                "whose key policy cannot allow s3.amazonaws.com; use a customer managed key"
            )
        else:
            notes.append(f"the key policy of {key} (of {arn}) must allow s3.amazonaws.com")
    return (
        "; ".join(notes)
        + f": kms:GenerateDataKey and kms:Decrypt, or S3 cannot deliver the bucket's event "
        f"notifications; the operator does not manage the keys ({S3_DOCS})"
    )
