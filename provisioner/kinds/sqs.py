"""Queue: one SQS queue named `resource.external_name`.

The reconciler resolves `spec.deadLetter.queueRef` to the target queue's ARN and passes it
in `resource.resolved` (absent: no redrive policy wanted).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws
from provisioner.kinds import keys, sqs_attributes, subscriptions, tagging
from provisioner.kinds.contract import (
    FieldDiff,
    KindDescriptor,
    Observation,
    OwnedResource,
    levels,
    owner_of,
)
from provisioner.kinds.tagging import ObservedTags, tag_changes
from provisioner.model import naming
from provisioner.model.account import AccountRef
from provisioner.model.resource import Dependency, Resource

# Resource.resolved key of the dead-letter target.
DEAD_LETTER_ARN = "deadLetterArn"


@dataclass(frozen=True)
class QueueSpec:
    queue_name: str | None = None
    fifo: bool = False
    visibility_timeout_seconds: int = 30
    message_retention_seconds: int = 345600
    delay_seconds: int = 0
    dead_letter_queue_ref: str | None = None
    max_receive_count: int = 5
    subscribe_to: tuple[subscriptions.Subscription, ...] = ()
    receive_wait_time_seconds: int = 0
    maximum_message_size_bytes: int = 262144
    # spec.encryption and the FIFO options (provisioner/kinds/sqs_attributes.py)
    settings: sqs_attributes.QueueSettings = sqs_attributes.NO_SETTINGS

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> QueueSpec:
        dead_letter = spec.get("deadLetter") or {}
        ref = (dead_letter.get("queueRef") or {}).get("name")
        return cls(
            queue_name=spec.get("queueName") or None,
            fifo=bool(spec.get("fifo", False)),
            visibility_timeout_seconds=int(spec.get("visibilityTimeoutSeconds", 30)),
            message_retention_seconds=int(spec.get("messageRetentionSeconds", 345600)),
            delay_seconds=int(spec.get("delaySeconds", 0)),
            dead_letter_queue_ref=ref or None,
            max_receive_count=int(dead_letter.get("maxReceiveCount", 5)),
            subscribe_to=subscriptions.parse(spec),
            receive_wait_time_seconds=int(spec.get("receiveWaitTimeSeconds", 0)),
            maximum_message_size_bytes=int(spec.get("maximumMessageSizeBytes", 262144)),
            settings=sqs_attributes.QueueSettings.parse(spec),
        )


# Mutable spec fields: (contract field, spec attribute, queue attribute).
ATTRIBUTES = (
    ("spec.visibilityTimeoutSeconds", "visibility_timeout_seconds", "VisibilityTimeout"),
    ("spec.messageRetentionSeconds", "message_retention_seconds", "MessageRetentionPeriod"),
    ("spec.delaySeconds", "delay_seconds", "DelaySeconds"),
    (
        "spec.receiveWaitTimeSeconds",
        "receive_wait_time_seconds",
        "ReceiveMessageWaitTimeSeconds",
    ),
    ("spec.maximumMessageSizeBytes", "maximum_message_size_bytes", "MaximumMessageSize"),
)
REDRIVE_FIELD = "spec.deadLetter"


class SqsClient(tagging.BatchTagLooks):
    tags_on_create = True  # CreateQueue takes tags

    def __init__(self, aws: Aws) -> None:
        self.aws = aws

    def _sqs(self, resource: Resource) -> Any:
        return self.aws.client("sqs", resource.region, resource.account)

    def arns(self, region: str, names: Sequence[str], account: AccountRef | None) -> dict[str, str]:
        partition, owner = self.aws.partition(region), self.aws.account_id(account)
        return {f"arn:{partition}:sqs:{region}:{owner}:{name}": name for name in names}

    def _observe(self, resource: Resource, batched: dict[str, str] | None) -> Observation:
        sqs, name = self._sqs(resource), resource.external_name
        # The URL recorded in status saves a GetQueueUrl on every look: a queue's URL never
        # changes, and a call on the URL of a queue that is gone answers NonExistentQueue.
        known = str(resource.status.get("queueUrl") or "")
        try:
            if known.rstrip("/").rsplit("/", 1)[-1] == name:
                url = known
            else:
                url = self.aws.call(sqs.get_queue_url, QueueName=name)["QueueUrl"]
            attrs = self.aws.call(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])
            tagged = tagging.observe_tags(
                resource,
                batched,
                lambda: self.aws.call(sqs.list_queue_tags, QueueUrl=url).get("Tags") or {},
            )
        except errors.NotFoundError:
            return Observation(exists=False)
        attributes = attrs.get("Attributes") or {}
        wanted = subscriptions.desired(resource.spec.subscribe_to, resource.resolved)
        subscribed = subscriptions.observe(
            self.aws,
            attributes.get("QueueArn", ""),
            attributes.get("Policy"),
            wanted,
            resource.account,
        )
        return self._observation(resource, url, attributes, tagged, subscribed)

    @staticmethod
    def _observation(
        resource: Resource,
        url: str,
        attributes: dict[str, str],
        tagged: ObservedTags,
        subscribed: dict[str, Any],
    ) -> Observation:
        name, arn = resource.external_name, attributes.get("QueueArn", "")
        wanted = subscriptions.desired(resource.spec.subscribe_to, resource.resolved)
        return Observation(
            exists=True,
            owner_uid=tagged.owner_uid,
            adoptable_by=tagged.adoptable_by,
            state="available",
            arn=arn,
            diffs=(
                _diffs(resource, attributes)
                + sqs_attributes.diffs(resource.spec.settings, resource.spec.fifo, attributes)
                + tagged.diffs
                + subscriptions.diffs(subscribed, wanted)
            ),
            connection={
                "queueUrl": url,
                "queueArn": arn,
                "queueName": name,
                "region": resource.region,
                **sqs_attributes.connection(attributes),
            },
            status={"queueUrl": url, keys.STATUS_FIELD: _key_policy(resource.spec)},
            client_state={
                "url": url,
                "attributes": attributes,
                "tags": tagged.tags,
                "subscriptions": subscribed,
            },
        )

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation:
        spec, sqs = resource.spec, self._sqs(resource)
        attributes = {key: str(getattr(spec, attr)) for _, attr, key in ATTRIBUTES}
        attributes.update(sqs_attributes.create_attributes(spec.settings, spec.fifo))
        if spec.fifo:
            attributes["FifoQueue"] = "true"
        if redrive := _redrive(resource):
            attributes["RedrivePolicy"] = json.dumps(redrive)
        url = self.aws.call(
            sqs.create_queue,
            QueueName=resource.external_name,
            Attributes=attributes,
            tags=resource.desired_tags,
        )["QueueUrl"]
        # CreateQueue answers with the existing queue when every attribute matches.
        tags = self.aws.call(sqs.list_queue_tags, QueueUrl=url).get("Tags") or {}
        if owner_of(tags) != resource.uid:
            raise errors.ConflictError(
                f"queue {resource.external_name} already exists and is not owned by {resource.ref}",
                "QueueNameExists",
            )
        # The queue is what was just asked for: its URL is https://<host>/<account>/<name>.
        account = url.rstrip("/").rsplit("/", 2)[-2]
        partition = self.aws.partition(resource.region)
        attributes["QueueArn"] = (
            f"arn:{partition}:sqs:{resource.region}:{account}:{resource.external_name}"
        )
        nothing_yet: dict[str, Any] = {"subscriptions": {}, "allowed": []}
        tagged = ObservedTags.of(resource, tags)
        return self._observation(resource, url, attributes, tagged, nothing_yet)

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        sqs, raw = self._sqs(resource), observation.client_state
        changes = {d.field: d for d in diffs}
        tags = changes.pop("tags", None)
        key_of = {field: key for field, _, key in ATTRIBUTES}
        attributes = {key_of[f]: str(d.desired) for f, d in changes.items() if f in key_of}
        attributes.update(
            sqs_attributes.update_attributes(
                resource.spec.settings, set(changes), raw["attributes"]
            )
        )
        if REDRIVE_FIELD in changes:
            policy = changes[REDRIVE_FIELD].desired
            attributes["RedrivePolicy"] = json.dumps(policy) if policy else ""
        if attributes:
            self.aws.call(sqs.set_queue_attributes, QueueUrl=raw["url"], Attributes=attributes)
        if subscriptions.FIELD in changes:
            subscriptions.apply(
                self.aws,
                sqs,
                raw["url"],
                raw["attributes"].get("QueueArn", ""),
                raw["attributes"].get("Policy"),
                raw["subscriptions"],
                subscriptions.desired(resource.spec.subscribe_to, resource.resolved),
                resource.account,
            )
        if tags is not None:
            to_set, to_remove = tag_changes(raw["tags"], tags.desired)
            if to_set:
                self.aws.call(sqs.tag_queue, QueueUrl=raw["url"], Tags=to_set)
            if to_remove:
                self.aws.call(sqs.untag_queue, QueueUrl=raw["url"], TagKeys=to_remove)

    def delete(self, resource: Resource, observation: Observation) -> None:
        sqs = self._sqs(resource)
        # A subscription outlives its queue in SNS: remove ours first.
        subscribed = observation.client_state.get("subscriptions") or {}
        subscriptions.unsubscribe(self.aws, subscribed.get("subscriptions") or {}, resource.account)
        try:
            url = (
                observation.client_state.get("url")
                or self.aws.call(sqs.get_queue_url, QueueName=resource.external_name)["QueueUrl"]
            )
            self.aws.call(sqs.delete_queue, QueueUrl=url)
        except errors.NotFoundError:
            return


def _redrive(resource: Resource) -> dict[str, Any] | None:
    """The redrive policy the spec asks for, once its dead-letter target is resolved."""
    target = resource.resolved.get(DEAD_LETTER_ARN)
    if not target:
        return None
    return {"deadLetterTargetArn": target, "maxReceiveCount": resource.spec.max_receive_count}


def _parse_redrive(policy: str | None) -> dict[str, Any] | None:
    if not policy:
        return None
    parsed = json.loads(policy)
    return {
        "deadLetterTargetArn": parsed.get("deadLetterTargetArn"),
        "maxReceiveCount": int(parsed.get("maxReceiveCount", 0)),
    }


def _diffs(resource: Resource, attributes: dict[str, str]) -> list[FieldDiff]:
    """The queue's attributes and redrive policy that differ from the spec."""
    diffs = []
    for field, attr, key in ATTRIBUTES:
        desired, text = getattr(resource.spec, attr), attributes.get(key)
        observed = int(text) if text is not None else None
        if observed != desired:
            diffs.append(FieldDiff(field, observed, desired))
    desired_redrive = _redrive(resource)
    observed_redrive = _parse_redrive(attributes.get("RedrivePolicy"))
    if observed_redrive != desired_redrive:
        diffs.append(FieldDiff(REDRIVE_FIELD, observed_redrive, desired_redrive))
    return diffs


def _key_policy(spec: QueueSpec) -> str | None:
    """status.kmsKeyPolicy: what the queue's KMS key must allow SNS, when it subscribes."""
    encryption = spec.settings.encryption
    key = encryption.kms_key_id if encryption.type == sqs_attributes.KMS else ""
    return keys.queue_note(key, len(spec.subscribe_to))


def dependencies(spec: QueueSpec) -> list[Dependency]:
    """The dead-letter target and the Topics subscribed to: all must be Ready first."""
    needed = [Dependency(s.key, "Topic", s.topic_ref, "Topic") for s in spec.subscribe_to]
    if spec.dead_letter_queue_ref:
        target = spec.dead_letter_queue_ref
        needed.insert(0, Dependency(DEAD_LETTER_ARN, "Queue", target, "dead-letter Queue"))
    return needed


def list_queues(aws: Aws, region: str) -> Iterator[OwnedResource]:
    sqs = aws.client("sqs", region)
    for page in sqs.get_paginator("list_queues").paginate():
        for url in page.get("QueueUrls", []):
            try:
                tags = aws.call(sqs.list_queue_tags, QueueUrl=url).get("Tags", {})
            except errors.NotFoundError:
                continue
            yield OwnedResource(KIND.kind, url.rsplit("/", 1)[-1], tags)


# spec.access (Service Authorization Reference, "Actions defined by Amazon SQS"): `read`
# holds Read and List actions only, so it receives but cannot delete what it received (a
# consumer that removes messages needs `write`); no level deletes the queue or sets the
# attributes the spec owns.
ACCESS = levels(
    read=(
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
        "sqs:ListQueueTags",
        "sqs:ListDeadLetterSourceQueues",
        "sqs:ReceiveMessage",
    ),
    write=("sqs:SendMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"),
    admin=(
        "sqs:PurgeQueue",
        "sqs:StartMessageMoveTask",
        "sqs:CancelMessageMoveTask",
        "sqs:ListMessageMoveTasks",
    ),
)


KIND = KindDescriptor(
    kind="Queue",
    plural="queues",
    short_names=("sqsq",),
    service="sqs",
    parse_spec=QueueSpec.parse,
    default_deletion_policy="Delete",
    name_field="queueName",
    derive_name=lambda namespace, name, uid, spec: naming.queue_name(
        namespace, name, uid, fifo=spec.fifo
    ),
    client=SqsClient,
    list_resources=list_queues,
    access_actions=ACCESS,
    dependencies=dependencies,
    error_codes=ErrorCodes(
        not_found=frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}),
        conflict=frozenset(
            {"QueueAlreadyExists", "QueueNameExists", "AWS.SimpleQueueService.QueueNameExists"}
        ),
        name_held=frozenset(
            {"AWS.SimpleQueueService.QueueDeletedRecently", "QueueDeletedRecently"}
        ),
    ),
    # SetQueueAttributes: "can take up to 60 seconds for most of the attributes to propagate
    # throughout the Amazon SQS system" (https://docs.aws.amazon.com/AWSSimpleQueueService/
    # latest/APIReference/API_SetQueueAttributes.html).
    settle_seconds=60.0,
)
