"""S3Bucket.spec.notifications: S3 event notifications to Queues and Topics of the bucket's
namespace and account.

Each entry is one configuration in the bucket's notification configuration (QueueConfigurations
or TopicConfigurations, Id `provisioner-<16 hex digits of the entry's hash>`), and each target
holds one statement of ours in its policy (Sid `provisioner-s3-notifications-<bucket>`) that
lets `s3.amazonaws.com` send to it (sqs:SendMessage, sns:Publish) only from this bucket
(`aws:SourceArn`) of this account (`aws:SourceAccount`). Configurations and statements of
anyone else (a Queue's own `provisioner-topic-subscriptions` among them) are kept as they are;
every write reads what it changes right before.

The record is `status.notifications`: the targets whose policy holds our statement, or is
about to. The reconciler writes it right before every update and delete
(`KindDescriptor.recorded_status`), so a target is recorded before its statement is put, and
leaves the record only after a look found the statement gone and no configuration of ours
naming it. Order, so that a crash anywhere leaves something the next pass finds:
- adding: the statement, then the configuration (S3 checks that it may send to a target
  when its configuration is put);
- removing: the configuration, then the statement;
- deleting the bucket: its configurations, then the statement in every target recorded or
  configured, then the bucket.

A look reads the bucket's notification configuration and each target's policy only when the
spec has notifications or some are recorded: a bucket without them costs no call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.crashpoints import crashpoint
from provisioner.kinds import keys
from provisioner.kinds.contract import FieldDiff
from provisioner.model.account import AccountRef
from provisioner.model.resource import Dependency, Resource

FIELD = "spec.notifications"
# status.notifications: [{targetArn, statementId}]
STATUS = "notifications"
CONFIG_ID_PREFIX = "provisioner-"
STATEMENT_ID_PREFIX = "provisioner-s3-notifications-"
PRINCIPAL = "s3.amazonaws.com"
# A target's service -> (the action S3 needs, the configuration list, the ARN's key in it).
SERVICES = {
    "sqs": ("sqs:SendMessage", "QueueConfigurations", "QueueArn"),
    "sns": ("sns:Publish", "TopicConfigurations", "TopicArn"),
}
REFS = {"queueRef": "Queue", "topicRef": "Topic"}


@dataclass(frozen=True)
class Notification:
    kind: str  # "Queue" or "Topic"
    ref: str
    events: tuple[str, ...]
    prefix: str = ""
    suffix: str = ""

    @property
    def key(self) -> str:
        """Its target's key in Resource.resolved."""
        return f"notify/{self.kind.lower()}/{self.ref}"


def parse(spec: Mapping[str, Any]) -> tuple[Notification, ...]:
    entries = []
    for entry in spec.get("notifications") or []:
        ref = "queueRef" if entry.get("queueRef") else "topicRef"
        entries.append(
            Notification(
                kind=REFS[ref],
                ref=str(entry[ref]["name"]),
                events=tuple(sorted(set(entry.get("events") or ()))),
                prefix=str(entry.get("prefix") or ""),
                suffix=str(entry.get("suffix") or ""),
            )
        )
    return tuple(entries)


def dependencies(entries: tuple[Notification, ...]) -> list[Dependency]:
    """Each target once: the reconciler waits for it to be Ready and resolves its ARN."""
    needed: dict[str, Dependency] = {}
    for entry in entries:
        role = f"notification {entry.kind}"
        needed.setdefault(entry.key, Dependency(entry.key, entry.kind, entry.ref, role))
    return list(needed.values())


def statement_id(bucket: str) -> str:
    return f"{STATEMENT_ID_PREFIX}{bucket}"


def wanted(resource: Resource) -> dict[str, dict[str, Any]]:
    """Our configurations as the spec asks for them, by Id, for the targets resolved (none
    in a deletion). A FIFO target is refused: S3 sends to standard queues and topics only."""
    configs: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(resource.spec.notifications):
        arn = resource.resolved.get(entry.key)
        if not arn:
            continue
        if arn.endswith(".fifo"):
            raise errors.TerminalError(
                f"spec.notifications[{index}]: {entry.kind} {entry.ref} is FIFO ({arn}); S3 "
                "sends event notifications to standard queues and topics only"
            )
        config = {
            "target": arn,
            "events": list(entry.events),
            "prefix": entry.prefix,
            "suffix": entry.suffix,
        }
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
        configs[f"{CONFIG_ID_PREFIX}{digest[:16]}"] = config
    return configs


def recorded(status: Mapping[str, Any]) -> set[str]:
    """The targets status.notifications records."""
    entries = status.get(STATUS) or []
    return {str(e["targetArn"]) for e in entries if isinstance(e, dict) and e.get("targetArn")}


@dataclass
class Looked:
    """What a look found: our configurations on the bucket, by Id; the targets whose policy
    holds a statement with our Sid; those of them where it is as wanted."""

    ours: dict[str, dict[str, Any]] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    allowed: set[str] = field(default_factory=set)
    # The KMS key each wanted target is encrypted with (read with its policy, no extra call).
    keys: dict[str, str] = field(default_factory=dict)


def read(aws: Aws, s3: Any, resource: Resource) -> dict[str, Any]:
    """{FIELD: Looked} for the bucket's configuration by contract field; {} (no call) when
    the spec has no notifications and none is recorded."""
    configs = wanted(resource)
    if not resource.spec.notifications and not recorded(resource.status):
        return {}
    answer = aws.call(s3.get_bucket_notification_configuration, Bucket=resource.external_name)
    looked = Looked(ours=_ours(answer))
    sid = statement_id(resource.external_name)
    targets = (
        _targets(configs.values()) | recorded(resource.status) | _targets(looked.ours.values())
    )
    wanted_targets = _targets(configs.values())
    for arn in sorted(targets):
        target = Target(aws, arn, resource.account)
        try:
            found = _find(target.policy(), sid)
        except errors.NotFoundError:
            continue  # the target is gone, and its policy with it
        if target.key and arn in wanted_targets:
            looked.keys[arn] = target.key
        if found is None:
            continue
        looked.held.add(arn)
        if arn in wanted_targets and _same(found, _statement(aws, resource, arn)):
            looked.allowed.add(arn)
    return {FIELD: looked}


def created(resource: Resource) -> dict[str, Any]:
    """What `read` would find on a bucket just created (none of ours), without a call."""
    if not resource.spec.notifications and not recorded(resource.status):
        return {}
    return {FIELD: Looked()}


def diffs(resource: Resource, config: Mapping[str, Any]) -> list[FieldDiff]:
    looked = config.get(FIELD)
    if not isinstance(looked, Looked):
        return []
    configs = wanted(resource)
    targets = _targets(configs.values())
    statements = [a for a in sorted(looked.held) if a in looked.allowed or a not in targets]
    observed = {"configurations": _describe(looked.ours), "statements": statements}
    desired = {"configurations": _describe(configs), "statements": sorted(targets)}
    return [] if observed == desired else [FieldDiff(FIELD, observed, desired)]


def status(resource: Resource, config: Mapping[str, Any]) -> dict[str, Any]:
    """status.notifications: every target that holds our statement or is about to."""
    looked = config.get(FIELD)
    if not isinstance(looked, Looked):
        return {}
    targets = _targets(wanted(resource).values()) | _targets(looked.ours.values()) | looked.held
    sid = statement_id(resource.external_name)
    return {
        STATUS: [{"targetArn": a, "statementId": sid} for a in sorted(targets)] or None,
        keys.STATUS_FIELD: keys.notification_note(looked.keys),
    }


def apply(aws: Aws, s3: Any, resource: Resource, looked: Looked) -> None:
    """Statements in the targets, then the bucket's configuration, then the statements of
    the targets no longer notified."""
    configs, bucket = wanted(resource), resource.external_name
    targets = _targets(configs.values())
    for arn in sorted(targets):
        _allow(aws, resource, arn)
    crashpoint("notifications-after-statements")
    answer = aws.call(s3.get_bucket_notification_configuration, Bucket=bucket)
    if _ours(answer) != configs:
        merged = _merged(answer, configs)
        aws.call(s3.put_bucket_notification_configuration, Bucket=bucket, **merged)
        crashpoint("notifications-after-configuration")
    stale = looked.held | _targets(looked.ours.values()) | _targets(_ours(answer).values())
    for arn in sorted((stale | recorded(resource.status)) - targets):
        _disallow(aws, resource, arn)


def remove_all(aws: Aws, s3: Any, resource: Resource, looked: Looked | None) -> None:
    """Before the bucket goes: our configurations, then our statement in every target
    recorded, configured or found holding one."""
    targets = recorded(resource.status) | (looked.held if looked else set())
    if looked is None and not targets:
        return
    bucket, ours = resource.external_name, {}
    try:
        answer = aws.call(s3.get_bucket_notification_configuration, Bucket=bucket)
        ours = _ours(answer)
        if ours:
            merged = _merged(answer, {})
            aws.call(s3.put_bucket_notification_configuration, Bucket=bucket, **merged)
            crashpoint("notifications-after-configuration")
    except errors.NotFoundError:
        pass  # the bucket is gone already; the statements are still ours to remove
    for arn in sorted(targets | _targets(ours.values())):
        _disallow(aws, resource, arn)


class Target:
    """A notification target's policy: a queue's attribute `Policy`, a topic's `Policy`."""

    def __init__(self, aws: Aws, arn: str, account: AccountRef | None) -> None:
        self.aws, self.arn = aws, arn
        _, _, self.service, region, _, self.name = arn.split(":", 5)
        self.client = aws.client(self.service, region, account)
        self.url = ""
        # The KMS key the target is encrypted with ("" when none), read with its policy.
        self.key = ""

    def policy(self) -> str | None:
        """The policy's text (None: none). Raises NotFoundError when the target is gone."""
        if self.service == "sns":
            answer = self.aws.call(self.client.get_topic_attributes, TopicArn=self.arn)
        else:
            self.url = (
                self.url
                or self.aws.call(self.client.get_queue_url, QueueName=self.name)["QueueUrl"]
            )
            answer = self.aws.call(
                self.client.get_queue_attributes,
                QueueUrl=self.url,
                AttributeNames=["Policy", "KmsMasterKeyId"],
            )
        attributes = answer.get("Attributes") or {}
        self.key = str(attributes.get("KmsMasterKeyId") or "")
        policy = attributes.get("Policy")
        return str(policy) if policy else None

    def set_policy(self, text: str) -> None:
        if self.service == "sns":
            self.aws.call(
                self.client.set_topic_attributes,
                TopicArn=self.arn,
                AttributeName="Policy",
                AttributeValue=text,
            )
        else:
            attributes = {"Policy": text}
            self.aws.call(
                self.client.set_queue_attributes, QueueUrl=self.url, Attributes=attributes
            )


def _allow(aws: Aws, resource: Resource, arn: str) -> None:
    """Our statement in the target's policy, read right before, beside what is there."""
    target, wanted_statement = Target(aws, arn, resource.account), _statement(aws, resource, arn)
    policy = target.policy()
    found = _find(policy, wanted_statement["Sid"])
    if found is None or not _same(found, wanted_statement):
        target.set_policy(_with(policy, wanted_statement["Sid"], wanted_statement, target.service))


def _disallow(aws: Aws, resource: Resource, arn: str) -> None:
    """Our statement out of the target's policy (nothing when it is not there, or the target
    is gone); every other statement is kept."""
    target, sid = Target(aws, arn, resource.account), statement_id(resource.external_name)
    try:
        policy = target.policy()
        if _find(policy, sid) is not None:
            target.set_policy(_with(policy, sid, None, target.service))
    except errors.NotFoundError:
        return


def _statement(aws: Aws, resource: Resource, target: str) -> dict[str, Any]:
    """The statement that lets S3 send to `target` from this bucket of this account only.
    The account is the target's own (no STS call): the reconciler resolves only targets in
    the bucket's CloudAccount, so it is the bucket's too."""
    bucket_arn = f"arn:{aws.partition(resource.region)}:s3:::{resource.external_name}"
    return {
        "Sid": statement_id(resource.external_name),
        "Effect": "Allow",
        "Principal": {"Service": PRINCIPAL},
        "Action": SERVICES[target.split(":")[2]][0],
        "Resource": target,
        "Condition": {
            "ArnEquals": {"aws:SourceArn": bucket_arn},
            "StringEquals": {"aws:SourceAccount": target.split(":")[4]},
        },
    }


def _targets(configs: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str(c["target"]) for c in configs}


def _ours(answer: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Our configurations in GetBucketNotificationConfiguration's answer, by Id."""
    ours = {}
    for _, key, arn_key in SERVICES.values():
        for config in answer.get(key) or []:
            if not str(config.get("Id") or "").startswith(CONFIG_ID_PREFIX):
                continue
            rules = ((config.get("Filter") or {}).get("Key") or {}).get("FilterRules") or []
            values = {str(r.get("Name", "")).lower(): str(r.get("Value", "")) for r in rules}
            ours[str(config["Id"])] = {
                "target": config.get(arn_key, ""),
                "events": sorted(config.get("Events") or []),
                "prefix": values.get("prefix", ""),
                "suffix": values.get("suffix", ""),
            }
    return ours


def _merged(answer: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """PutBucketNotificationConfiguration's arguments: everyone else's configurations as
    they are, ours as `configs`."""
    keys = ("TopicConfigurations", "QueueConfigurations", "LambdaFunctionConfigurations")
    merged: dict[str, Any] = {}
    for key in keys:
        kept = [c for c in answer.get(key) or [] if not _is_ours(key, c)]
        if kept:
            merged[key] = kept
    for config_id, config in sorted(configs.items()):
        _, key, arn_key = SERVICES[str(config["target"]).split(":")[2]]
        entry: dict[str, Any] = {"Id": config_id, arn_key: config["target"]}
        entry["Events"] = list(config["events"])
        rules = [{"Name": n, "Value": config[n]} for n in ("prefix", "suffix") if config[n]]
        if rules:
            entry["Filter"] = {"Key": {"FilterRules": rules}}
        merged.setdefault(key, []).append(entry)
    if "EventBridgeConfiguration" in answer:
        merged["EventBridgeConfiguration"] = answer["EventBridgeConfiguration"]
    return {"NotificationConfiguration": merged}


def _is_ours(key: str, config: Mapping[str, Any]) -> bool:
    mine = key in ("TopicConfigurations", "QueueConfigurations")
    return mine and str(config.get("Id") or "").startswith(CONFIG_ID_PREFIX)


def _describe(configs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    described = []
    for config_id, config in sorted(configs.items(), key=lambda kv: (kv[1]["target"], kv[0])):
        arn_key = "queueArn" if str(config["target"]).split(":")[2] == "sqs" else "topicArn"
        entry = {"id": config_id, arn_key: config["target"], "events": list(config["events"])}
        entry.update({n: config[n] for n in ("prefix", "suffix") if config[n]})
        described.append(entry)
    return described


def _document(policy: str | None) -> dict[str, Any] | None:
    """The policy's document ({} for none; None for what is no JSON document)."""
    try:
        document = json.loads(policy) if policy else {}
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _statements(document: Mapping[str, Any] | None) -> list[Any]:
    found = (document or {}).get("Statement") or []
    return found if isinstance(found, list) else [found]


def _find(policy: str | None, sid: str) -> dict[str, Any] | None:
    for statement in _statements(_document(policy)):
        if isinstance(statement, dict) and statement.get("Sid") == sid:
            return statement
    return None


def _with(policy: str | None, sid: str, statement: dict[str, Any] | None, service: str) -> str:
    """The policy with our statement replaced by `statement` (removed when None)."""
    document = _document(policy)
    if document is None:
        # Never written over: what it holds is someone's, and cannot be kept.
        raise errors.TerminalError("the policy of a notification target is not a JSON document")
    others = [s for s in _statements(document) if not (isinstance(s, dict) and s.get("Sid") == sid)]
    if statement is not None:
        others.append(statement)
    if not others and service == "sqs":
        return ""  # a queue without a policy, as before
    return json.dumps({"Version": "2012-10-17", **document, "Statement": others})


def _same(found: Mapping[str, Any], wanted_statement: Mapping[str, Any]) -> bool:
    """The same statement, however the cloud spells it (one value or a list of one, the
    action's case)."""

    def normal(value: Any) -> Any:
        if isinstance(value, list):
            items = sorted((normal(v) for v in value), key=json.dumps)
            return items[0] if len(items) == 1 else items
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items()}
        return value

    def shape(statement: Mapping[str, Any]) -> Any:
        action = normal(statement.get("Action"))
        return normal(
            {**statement, "Action": action.lower() if isinstance(action, str) else action}
        )

    return bool(shape(found) == shape(wanted_statement))
