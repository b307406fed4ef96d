"""A Queue's subscriptions to Topics: the SNS subscriptions and the queue policy that lets
those topics send.

The queue policy carries one statement of ours (Sid `provisioner-topic-subscriptions`)
listing the topics allowed to send; statements of anyone else are kept as they are. That
statement is also the record of which topics this queue subscribed to, so a subscription
whose entry was removed from the spec is still found and removed.

Order, so that a crash anywhere leaves something the next pass finds: subscriptions are
made or removed first, the policy is written last, from a read made right before the write
(a bucket's notification statement may share the policy: provisioner/kinds/notifications.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.kinds.contract import FieldDiff
from provisioner.model.account import AccountRef

FIELD = "spec.subscribeTo"
STATEMENT_ID = "provisioner-topic-subscriptions"
# Resource.resolved keys of the Topics subscribed to: "topic/<name>".
KEY_PREFIX = "topic/"


@dataclass(frozen=True)
class Subscription:
    topic_ref: str
    raw_message_delivery: bool = False

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}{self.topic_ref}"


def parse(spec: Mapping[str, Any]) -> tuple[Subscription, ...]:
    return tuple(
        Subscription(
            topic_ref=str(entry["topicRef"]["name"]),
            raw_message_delivery=bool(entry.get("rawMessageDelivery", False)),
        )
        for entry in spec.get("subscribeTo") or []
    )


def desired(
    subscriptions: tuple[Subscription, ...], resolved: Mapping[str, str]
) -> dict[str, bool]:
    """Topic ARN -> raw message delivery, for the topics the reconciler resolved."""
    return {resolved[s.key]: s.raw_message_delivery for s in subscriptions if s.key in resolved}


def allowed_topics(policy: str | None) -> list[str]:
    """The topic ARNs our statement of the queue policy lets send."""
    statement = _ours(_parse_policy(policy))
    if statement is None:
        return []
    arns = statement.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn", [])
    return sorted([arns] if isinstance(arns, str) else arns)


def observe(
    aws: Aws,
    queue_arn: str,
    policy: str | None,
    wanted: Mapping[str, bool],
    account: AccountRef | None = None,
) -> dict[str, Any]:
    """What exists now: {"subscriptions": {topicArn: (subscriptionArn, raw)}, "allowed": [...]}.

    Looks only at topics that are wanted or that our policy statement lists: a queue
    without subscriptions costs no SNS call.
    """
    allowed = allowed_topics(policy)
    found: dict[str, tuple[str, bool]] = {}
    for topic in sorted(set(wanted) | set(allowed)):
        sns = aws.client("sns", _region(topic), account)
        page: dict[str, Any] = {}
        try:
            while True:
                token = {"NextToken": page["NextToken"]} if page.get("NextToken") else {}
                page = aws.call(sns.list_subscriptions_by_topic, TopicArn=topic, **token)
                for sub in page.get("Subscriptions", []):
                    if sub.get("Protocol") == "sqs" and sub.get("Endpoint") == queue_arn:
                        found[topic] = (sub["SubscriptionArn"], _raw(aws, sns, sub))
                if not page.get("NextToken"):
                    break
        except errors.NotFoundError:
            continue  # the topic is gone, and its subscriptions with it
    return {"subscriptions": found, "allowed": allowed}


def _raw(aws: Aws, sns: Any, subscription: Mapping[str, Any]) -> bool:
    arn = subscription["SubscriptionArn"]
    attributes = aws.call(sns.get_subscription_attributes, SubscriptionArn=arn)["Attributes"]
    return bool(attributes.get("RawMessageDelivery", "false") == "true")


def diffs(state: Mapping[str, Any], wanted: Mapping[str, bool]) -> list[FieldDiff]:
    current = {topic: raw for topic, (_, raw) in state["subscriptions"].items()}
    if current == dict(wanted) and state["allowed"] == sorted(wanted):
        return []
    return [FieldDiff(FIELD, _describe(current), _describe(wanted))]


def apply(
    aws: Aws,
    sqs: Any,
    queue_url: str,
    queue_arn: str,
    policy: str | None,
    state: Mapping[str, Any],
    wanted: Mapping[str, bool],
    account: AccountRef | None = None,
) -> None:
    """Subscribe, fix raw delivery, unsubscribe what is no longer wanted; then the policy."""
    existing: dict[str, tuple[str, bool]] = state["subscriptions"]
    for topic, raw in wanted.items():
        sns = aws.client("sns", _region(topic), account)
        if topic not in existing:
            aws.call(
                sns.subscribe,
                TopicArn=topic,
                Protocol="sqs",
                Endpoint=queue_arn,
                Attributes={"RawMessageDelivery": "true" if raw else "false"},
                ReturnSubscriptionArn=True,
            )
        elif existing[topic][1] != raw:
            aws.call(
                sns.set_subscription_attributes,
                SubscriptionArn=existing[topic][0],
                AttributeName="RawMessageDelivery",
                AttributeValue="true" if raw else "false",
            )
    unsubscribe(aws, {t: s for t, s in existing.items() if t not in wanted})
    if _with_statement(policy, queue_arn, sorted(wanted)) == (policy or ""):
        return  # the look found our statement as wanted
    # Read again right before writing: a bucket notifying this queue may have put its own
    # statement since the look, and every statement but ours is written back as it is.
    answer = aws.call(sqs.get_queue_attributes, QueueUrl=queue_url, AttributeNames=["Policy"])
    current = (answer.get("Attributes") or {}).get("Policy")
    new_policy = _with_statement(current, queue_arn, sorted(wanted))
    if new_policy != (current or ""):
        aws.call(sqs.set_queue_attributes, QueueUrl=queue_url, Attributes={"Policy": new_policy})


def unsubscribe(
    aws: Aws, subscriptions: Mapping[str, tuple[str, bool]], account: AccountRef | None = None
) -> None:
    for topic, (arn, _) in subscriptions.items():
        try:
            aws.call(aws.client("sns", _region(topic), account).unsubscribe, SubscriptionArn=arn)
        except errors.NotFoundError:
            continue


def _region(topic_arn: str) -> str:
    return topic_arn.split(":")[3]


def _describe(subscriptions: Mapping[str, bool]) -> list[dict[str, Any]]:
    return [
        {"topicArn": topic, "rawMessageDelivery": raw}
        for topic, raw in sorted(subscriptions.items())
    ]


def _parse_policy(policy: str | None) -> dict[str, Any]:
    if not policy:
        return {}
    try:
        parsed = json.loads(policy)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _ours(document: Mapping[str, Any]) -> dict[str, Any] | None:
    for statement in document.get("Statement") or []:
        if isinstance(statement, dict) and statement.get("Sid") == STATEMENT_ID:
            return statement
    return None


def _with_statement(policy: str | None, queue_arn: str, topics: list[str]) -> str:
    """The queue policy with our statement set to `topics` (removed when there are none)."""
    document = _parse_policy(policy)
    others = [
        s
        for s in document.get("Statement") or []
        if not (isinstance(s, dict) and s.get("Sid") == STATEMENT_ID)
    ]
    if topics:
        others.append(
            {
                "Sid": STATEMENT_ID,
                "Effect": "Allow",
                "Principal": {"Service": "sns.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": topics}},
            }
        )
    if not others:
        return ""
    return json.dumps({"Version": "2012-10-17", **document, "Statement": others})
