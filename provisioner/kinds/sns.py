"""Topic: one SNS topic named `resource.external_name`.

An SNS topic's ARN is `arn:aws:sns:<region>:<account>:<name>`; the account is its
CloudAccount's, or the one the operator's own credentials act in (asked of STS once,
`Aws.account_id`), so a topic is observed by its ARN without listing every topic.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.errors import ErrorCodes
from provisioner.aws.session import Aws
from provisioner.kinds import keys, tagging
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
from provisioner.model.resource import Resource

DISPLAY_NAME_FIELD = "spec.displayName"
KMS_KEY_FIELD = "spec.kmsKeyId"
# status: the key the operator put on the topic (spec.kmsKeyId when it was last applied).
MANAGED_KEY = "kmsKeyId"
DEDUPLICATION_FIELD = "spec.contentBasedDeduplication"
# Mutable spec fields: contract field -> topic attribute (SetTopicAttributes takes one a call).
ATTRIBUTES = {
    DISPLAY_NAME_FIELD: "DisplayName",
    KMS_KEY_FIELD: "KmsMasterKeyId",
    DEDUPLICATION_FIELD: "ContentBasedDeduplication",
}


@dataclass(frozen=True)
class TopicSpec:
    topic_name: str | None = None
    fifo: bool = False
    display_name: str = ""
    # "": no server-side encryption (SNS's default)
    kms_key_id: str = ""
    # FIFO topics only
    content_based_deduplication: bool = False

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> TopicSpec:
        return cls(
            topic_name=spec.get("topicName") or None,
            fifo=bool(spec.get("fifo", False)),
            display_name=str(spec.get("displayName") or ""),
            kms_key_id=str(spec.get("kmsKeyId") or ""),
            content_based_deduplication=bool(spec.get("contentBasedDeduplication", False)),
        )


class SnsClient(tagging.BatchTagLooks):
    tags_on_create = True  # CreateTopic takes tags

    def __init__(self, aws: Aws) -> None:
        self.aws = aws

    def _sns(self, resource: Resource) -> Any:
        return self.aws.client("sns", resource.region, resource.account)

    def topic_arn(self, resource: Resource) -> str:
        return self._arn(resource.region, resource.account, resource.external_name)

    def _arn(self, region: str, account: AccountRef | None, name: str) -> str:
        return f"arn:aws:sns:{region}:{self.aws.account_id(account)}:{name}"

    def arns(self, region: str, names: Sequence[str], account: AccountRef | None) -> dict[str, str]:
        return {self._arn(region, account, name): name for name in names}

    def _observe(self, resource: Resource, batched: dict[str, str] | None) -> Observation:
        sns, arn = self._sns(resource), self.topic_arn(resource)
        try:
            attributes = self.aws.call(sns.get_topic_attributes, TopicArn=arn)["Attributes"]
            tagged = tagging.observe_tags(
                resource,
                batched,
                lambda: _tags(self.aws.call(sns.list_tags_for_resource, ResourceArn=arn)),
            )
        except errors.NotFoundError:
            return Observation(exists=False)
        return self._observation(resource, arn, attributes, tagged)

    @staticmethod
    def _observation(
        resource: Resource, arn: str, attributes: dict[str, str], tagged: ObservedTags
    ) -> Observation:
        return Observation(
            exists=True,
            owner_uid=tagged.owner_uid,
            adoptable_by=tagged.adoptable_by,
            state="available",
            arn=arn,
            diffs=_diffs(resource, attributes) + tagged.diffs,
            connection={
                "topicArn": arn,
                "topicName": resource.external_name,
                "region": resource.region,
                **({"kmsKeyId": key} if (key := attributes.get("KmsMasterKeyId")) else {}),
            },
            status={
                keys.STATUS_FIELD: keys.topic_note(resource.spec.kms_key_id),
                # The key this operator encrypts the topic with: only that is ever removed.
                MANAGED_KEY: resource.spec.kms_key_id or None,
            },
            client_state={"tags": tagged.tags},
        )

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation:
        spec, sns = resource.spec, self._sns(resource)
        attributes = {"DisplayName": spec.display_name}
        if spec.kms_key_id:
            attributes["KmsMasterKeyId"] = spec.kms_key_id
        if spec.fifo:
            attributes["FifoTopic"] = "true"
            attributes["ContentBasedDeduplication"] = _text(spec.content_based_deduplication)
        arn = self.aws.call(
            sns.create_topic,
            Name=resource.external_name,
            Attributes=attributes,
            Tags=[{"Key": k, "Value": v} for k, v in resource.desired_tags.items()],
        )["TopicArn"]
        # CreateTopic answers with the existing topic of that name: ours only if tagged so.
        tags = _tags(self.aws.call(sns.list_tags_for_resource, ResourceArn=arn))
        if owner_of(tags) != resource.uid:
            raise errors.ConflictError(
                f"topic {resource.external_name} already exists and is not owned by {resource.ref}",
                "TopicAlreadyExists",
            )
        return self._observation(resource, arn, attributes, ObservedTags.of(resource, tags))

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        sns, arn = self._sns(resource), observation.arn
        for diff in diffs:
            if diff.field in ATTRIBUTES:
                self.aws.call(
                    sns.set_topic_attributes,
                    TopicArn=arn,
                    AttributeName=ATTRIBUTES[diff.field],
                    AttributeValue=_text(diff.desired),
                )
            elif diff.field == "tags":
                to_set, to_remove = tag_changes(observation.client_state["tags"], diff.desired)
                if to_set:
                    pairs = [{"Key": k, "Value": v} for k, v in to_set.items()]
                    self.aws.call(sns.tag_resource, ResourceArn=arn, Tags=pairs)
                if to_remove:
                    self.aws.call(sns.untag_resource, ResourceArn=arn, TagKeys=to_remove)

    def delete(self, resource: Resource, observation: Observation) -> None:
        # DeleteTopic succeeds for a topic that is already gone; its subscriptions go with it.
        self.aws.call(self._sns(resource).delete_topic, TopicArn=observation.arn)


def _tags(answer: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in answer.get("Tags") or []}


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _diffs(resource: Resource, attributes: dict[str, str]) -> list[FieldDiff]:
    """The topic's attributes that differ from the spec (all on GetTopicAttributes' answer)."""
    spec = resource.spec
    pairs: list[tuple[str, Any, Any]] = [
        (DISPLAY_NAME_FIELD, attributes.get("DisplayName", ""), spec.display_name),
    ]
    if spec.kms_key_id or resource.status.get(MANAGED_KEY):
        # Without spec.kmsKeyId, encryption is managed only if this operator set it: a key
        # someone else put on the topic is left alone, never removed.
        pairs.append((KMS_KEY_FIELD, attributes.get("KmsMasterKeyId") or "", spec.kms_key_id))
    if spec.fifo:
        dedup = str(attributes.get("ContentBasedDeduplication", "false")).lower() == "true"
        pairs.append((DEDUPLICATION_FIELD, dedup, spec.content_based_deduplication))
    return [FieldDiff(f, seen, wanted) for f, seen, wanted in pairs if seen != wanted]


def list_topics(aws: Aws, region: str) -> Iterator[OwnedResource]:
    sns = aws.client("sns", region)
    for page in sns.get_paginator("list_topics").paginate():
        for topic in page.get("Topics", []):
            arn = topic["TopicArn"]
            try:
                tags = _tags(aws.call(sns.list_tags_for_resource, ResourceArn=arn))
            except errors.NotFoundError:
                continue
            yield OwnedResource(KIND.kind, arn.rsplit(":", 1)[-1], tags)


# spec.access (Service Authorization Reference, "Actions defined by Amazon SNS"): no level
# deletes the topic or sets the attributes the spec owns.
ACCESS = levels(
    read=("sns:GetTopicAttributes", "sns:ListSubscriptionsByTopic", "sns:ListTagsForResource"),
    write=("sns:Publish",),
    admin=("sns:Subscribe", "sns:ConfirmSubscription"),
)


KIND = KindDescriptor(
    kind="Topic",
    plural="topics",
    short_names=("snst",),
    service="sns",
    parse_spec=TopicSpec.parse,
    default_deletion_policy="Delete",
    name_field="topicName",
    # SNS allows 256 characters of the same alphabet as SQS; the queue's shorter rule keeps
    # the two kinds' derived names alike.
    derive_name=lambda namespace, name, uid, spec: naming.queue_name(
        namespace, name, uid, fifo=spec.fifo
    ),
    client=SnsClient,
    list_resources=list_topics,
    access_actions=ACCESS,
    error_codes=ErrorCodes(
        not_found=frozenset({"NotFoundException"}),
        retryable=frozenset({"Throttled", "ConcurrentAccess", "ConcurrentAccessException"}),
    ),
)
