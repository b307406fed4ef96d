"""SQS in the aws-like cloud: QueueDeletedRecently for a name deleted less than 60 s ago, and
GetQueueAttributes showing the old values for a while after SetQueueAttributes."""

from __future__ import annotations

import json
import random
import urllib.parse

from aiohttp import web

from provisioner_dev.awslike_durations import Durations
from provisioner_dev.awslike_http import Call, forwarded_headers, plain
from provisioner_dev.cloudprofile import Profile


class SqsModel:
    RETENTION = "MessageRetentionPeriod"

    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.deleted: dict[tuple[str, str, str], float] = {}
        self.durations = Durations(profile, rng)
        # queue -> attribute -> (old value or None, shown until)
        self.stale: dict[tuple[str, str, str], dict[str, tuple[str | None, float]]] = {}

    def name_held(self, key: tuple[str, str, str], now: float) -> bool:
        return now < self.deleted.get(key, 0.0)

    def queue_deleted(self, key: tuple[str, str, str], now: float) -> None:
        self.deleted[key] = now + self.durations.draw("sqs.deleted_name")
        self.stale.pop(key, None)

    def attributes_set(
        self, key: tuple[str, str, str], before: dict[str, str], new: dict[str, str], now: float
    ) -> None:
        for attr, value in new.items():
            if before.get(attr) == value:
                continue
            name = "sqs.retention" if attr == self.RETENTION else "sqs.attributes"
            until = now + self.durations.draw(name)
            self.stale.setdefault(key, {})[attr] = (before.get(attr), until)

    def render(
        self, key: tuple[str, str, str], attributes: dict[str, str], asked: list[str], now: float
    ) -> None:
        for attr, (old, until) in self.stale.get(key, {}).items():
            if now >= until or not ({"All", attr} & set(asked)):
                continue
            if old is None:
                attributes.pop(attr, None)
            else:
                attributes[attr] = old


def queue_key(account: str, region: str, url: str) -> tuple[str, str, str]:
    """(account, region, name) of the queue a QueueUrl names."""
    parts = [p for p in urllib.parse.urlparse(url).path.split("/") if p]
    if len(parts) >= 2:
        return parts[-2], region, parts[-1]
    return account, region, parts[-1] if parts else ""


async def handle_sqs(sqs: SqsModel, call: Call) -> web.StreamResponse:
    """An SQS JSON-protocol call, answered as AWS would answer it now."""
    try:
        params = json.loads(call.body or b"{}")
    except ValueError:
        params = {}
    now = call.clock()
    headers = forwarded_headers(call.request)
    if call.action == "CreateQueue":
        key = (call.account, call.region, str(params.get("QueueName", "")))
        if sqs.name_held(key, now):
            return call.refuse(
                "sqs",
                call.action,
                "json",
                400,
                "QueueDeletedRecently",
                "You must wait 60 seconds after deleting a queue before you can create "
                "another queue with the same name.",
                query_code="AWS.SimpleQueueService.QueueDeletedRecently",
            )
    key = queue_key(call.account, call.region, str(params.get("QueueUrl", "")))
    before: dict[str, str] | None = None
    if call.action == "SetQueueAttributes":
        before = await _attributes(call, headers, params.get("QueueUrl"))
    answer = await call.forward(headers)
    if answer.status != 200:
        return plain(answer)
    now = call.clock()
    if call.action == "DeleteQueue":
        sqs.queue_deleted(key, now)
    elif call.action == "SetQueueAttributes" and before is not None:
        sqs.attributes_set(key, before, dict(params.get("Attributes") or {}), now)
    elif call.action == "GetQueueAttributes" and sqs.stale.get(key):
        payload = json.loads(answer.body)
        attributes = payload.setdefault("Attributes", {})
        sqs.render(key, attributes, list(params.get("AttributeNames") or []), now)
        return web.Response(
            status=200,
            body=json.dumps(payload),
            headers={k: v for k, v in answer.headers.items() if k.lower() != "content-length"},
        )
    return plain(answer)


async def _attributes(call: Call, headers: dict[str, str], url: object) -> dict[str, str] | None:
    """The queue's attributes as moto has them now; None when moto does not answer them."""
    internal = dict(headers, **{"X-Amz-Target": "AmazonSQS.GetQueueAttributes"})
    query = json.dumps({"QueueUrl": url, "AttributeNames": ["All"]})
    current = await call.upstream.send("POST", "/", internal, query.encode())
    if current.status != 200:
        return None
    return json.loads(current.body).get("Attributes") or {}
