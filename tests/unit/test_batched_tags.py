"""The periodic looks at queues, topics and buckets read their tags in batches (the Resource
Groups Tagging API's GetResources, one call per 100 ARNs): each look then makes only its
kind's own reads, and still finds drift, a foreign owner and a missing resource on the
service's own word. Against moto in process; the calls are counted as boto3 makes them."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from provisioner.aws.budget import CallBudget, Limit
from provisioner.aws.session import Aws, AwsSettings
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import BatchObserver, BatchTagReader
from provisioner.kinds.registry import ERROR_CODES
from provisioner.kinds.s3 import S3Client
from provisioner.kinds.sns import SnsClient
from provisioner.kinds.sqs import SqsClient
from provisioner.kinds.tagging import PAGE
from provisioner.model.resource import OWNER_UID_TAG
from provisioner.reconciler.engine import Reconciler

REGION = "us-east-1"
SPECS: dict[str, dict[str, Any]] = {"Queue": {}, "Topic": {}, "S3Bucket": {}}
CLIENTS = {"Queue": SqsClient, "Topic": SnsClient, "S3Bucket": S3Client}
# The per-resource tag read each kind's batched look saves.
TAG_READ = {
    "Queue": "ListQueueTags",
    "Topic": "ListTagsForResource",
    "S3Bucket": "GetBucketTagging",
}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Aws, collections.Counter[str]]]:
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        cloud = Aws(AwsSettings(region=REGION, max_wait=0.0), ERROR_CODES)
        calls: collections.Counter[str] = collections.Counter()
        original = cloud.client

        def counted(*args: Any, **kwargs: Any) -> Any:
            client = original(*args, **kwargs)
            if not getattr(client, "_counted", False):
                client.meta.events.register(
                    "before-call", lambda model, **_: calls.update([model.name])
                )
                client._counted = True
            return client

        cloud.client = counted  # type: ignore[method-assign]
        yield cloud, calls


def resource(kind: str, name: str, uid: str | None = None, cloud_name: str = "") -> Any:
    spec = dict(SPECS[kind])
    if cloud_name:
        spec[kinds.descriptor(kind).name_field] = cloud_name
    body = {
        "kind": kind,
        "metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", "generation": 1},
        "spec": spec,
    }
    return kinds.parse(body, region=REGION, cluster_id="test")


@pytest.mark.parametrize("kind", ["Queue", "Topic", "S3Bucket"])
def test_a_batched_look_makes_no_tag_read_of_its_own(aws, kind):
    cloud, calls = aws
    client = CLIENTS[kind](cloud)
    assert isinstance(client, BatchTagReader) and not isinstance(client, BatchObserver)
    made = [resource(kind, f"r{i}") for i in range(30)]
    for r in made:
        client.create(r, {})
    calls.clear()
    found = client.tags_many(REGION, [r.external_name for r in made] + ["absent-one"])
    assert set(found) == {r.external_name for r in made}
    # One call per 100 ARNs on AWS; moto pages its answer by about 100 tags, and the
    # pages only follow the first call's token.
    assert 1 <= calls["GetResources"] <= 1 + 30 * len(made[0].desired_tags) // 100
    calls.clear()
    for r in made:
        obs = client.observe_tagged(r, found[r.external_name])
        assert obs.exists and obs.owned_by(r) and obs.diffs == [], obs
    assert calls[TAG_READ[kind]] == 0 and calls["GetResources"] == 0
    # Without the batch, the look reads them one by one as before.
    calls.clear()
    assert client.observe(made[0]).diffs == []
    assert calls[TAG_READ[kind]] == 1


@pytest.mark.parametrize("kind", ["Queue", "Topic", "S3Bucket"])
def test_drift_a_foreign_owner_and_absence_are_decided_by_the_service(aws, kind):
    cloud, calls = aws
    client = CLIENTS[kind](cloud)
    ours = resource(kind, "ours")
    client.create(ours, {})
    tags = client.tags_many(REGION, [ours.external_name])[ours.external_name]

    # A tag changed behind the operator's back: the batch shows it, the service confirms.
    drifted = {**tags, "team": "someone-else"}
    calls.clear()
    obs = client.observe_tagged(ours, drifted)
    assert calls[TAG_READ[kind]] == 1
    # The service's own word (no drift in the cloud here) wins over the batch's.
    assert obs.diffs == []

    # Another owner in the batch's answer: the service's tags decide ownership.
    calls.clear()
    other = resource(kind, "other", uid="someone-else", cloud_name=ours.external_name)
    foreign = client.observe_tagged(other, tags)
    assert calls[TAG_READ[kind]] == 1
    assert foreign.exists and foreign.owner_uid == ours.uid and not foreign.owned_by(other)

    # Gone: found missing whatever the batch said.
    assert not client.observe_tagged(resource(kind, "never-made"), tags).exists


def test_a_batch_never_stands_in_for_other_owners_or_differences():
    from provisioner.kinds.tagging import stands_in

    r = resource("Queue", "q")
    assert stands_in(r, dict(r.desired_tags))
    assert stands_in(r, {**r.desired_tags, "aws:cloudformation:stack-name": "x"})
    assert not stands_in(r, None)
    assert not stands_in(r, {**r.desired_tags, OWNER_UID_TAG: "other"})
    assert not stands_in(r, {**r.desired_tags, "extra": "1"})
    assert not stands_in(r, {k: v for k, v in r.desired_tags.items() if k != OWNER_UID_TAG})


def test_arn_lists_go_in_pages_of_100(aws):
    cloud, calls = aws
    sqs = boto3.client("sqs", region_name=REGION)
    names = [f"page-{i}" for i in range(PAGE + 5)]
    for name in names:
        sqs.create_queue(QueueName=name, tags={"k": "v"})
    calls.clear()
    found = SqsClient(cloud).tags_many(REGION, names)
    assert set(found) == set(names) and found[names[0]] == {"k": "v"}
    # Two lists of ARNs (100 + 5): two calls on AWS. moto pages its answers by 50
    # resources (or 100 tags), and its pages follow the first call's token.
    assert 2 <= calls["GetResources"] <= 3


class Tagged:
    """A kind whose tags come in batches; counts its calls."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.batches: list[list[str]] = []
        self.looks: list[tuple[str, dict[str, str] | None]] = []

    def tags_many(self, region: str, names: Any, account: Any = None) -> dict[str, Any]:
        self.batches.append(list(names))
        return {n: {"k": n} for n in names if n in self.names}

    def observe_tagged(self, resource: Any, tags: dict[str, str]) -> Any:
        from provisioner.kinds.contract import Observation

        self.looks.append((resource.external_name, tags))
        return Observation(exists=True, state="tagged")

    def observe(self, resource: Any) -> Any:
        from provisioner.kinds.contract import Observation

        self.looks.append((resource.external_name, None))
        return Observation(exists=True, state="alone")


def test_a_resync_pass_uses_the_batched_tags_once_and_only_when_fresh():
    a, b = resource("Queue", "a"), resource("Queue", "b")
    cloud = Tagged({a.external_name})
    rec = Reconciler(
        Settings(region=REGION, cluster_id="test", workers=2), None, {"Queue": cloud}, print
    )
    due = [(r.uid, r.region, r.external_name, None) for r in (a, b)]
    assert asyncio.run(rec.prefetch("Queue", due)) == 1
    assert cloud.batches == [[a.external_name, b.external_name]]

    async def look(r: Any) -> str:
        return (await rec.observer.observe(r, resync=True)).state

    assert asyncio.run(look(a)) == "tagged"
    assert asyncio.run(look(a)) == "alone"  # used once
    assert asyncio.run(look(b)) == "alone"  # not in the answer: reads by itself
    asyncio.run(rec.prefetch("Queue", due))
    rec.states.of(a.uid).last_write = time.monotonic()  # written since: the answer may predate it
    assert asyncio.run(look(a)) == "alone"


def test_the_looks_have_threads_of_their_own():
    import threading

    rec = Reconciler(Settings(region=REGION, cluster_id="test", workers=4), None, {}, print)
    names: list[str] = []

    async def scenario() -> None:
        async def load() -> None:
            names.append(await rec.in_thread(lambda: threading.current_thread().name))
            return None

        await rec.resync_current("u", load, None)
        names.append(await rec.in_thread(lambda: threading.current_thread().name))

    asyncio.run(scenario())
    assert names[0].startswith("look") and names[1].startswith("cloud"), names
    assert rec.look_executor._max_workers == 2


def test_a_look_whose_budget_has_calls_waiting_is_put_off():
    from provisioner.runtime.resync import ResyncScheduler

    now = [100.0]
    budget = CallBudget(clock=lambda: now[0], sleep=lambda s: None)
    buckets = budget.buckets_for("sqs", REGION, "ListQueueTags")
    assert [b.name for b in buckets] == ["sqs.tagging"]
    assert budget.backlog("sqs", REGION) == 0.0
    for _ in range(8):  # 5 in the burst, 3 more wait 0.2 s apart
        budget.acquire("sqs", buckets)
    assert budget.backlog("sqs", REGION) == pytest.approx(0.6)
    assert budget.backlog("sqs", "eu-west-1") == 0.0 and budget.backlog("sns", REGION) == 0.0
    assert budget.backlog("sqs", REGION, account="111111111111") == 0.0

    class Owner:
        clients: dict[str, Any] = {"Queue": object(), "Topic": object()}

        def look_backlog(self, kind: str, region: str, account: Any = None) -> float:
            return budget.backlog(kinds.descriptor(kind).service, region)

    scheduler = ResyncScheduler(Owner(), Settings(resync_seconds=300.0), None, None)
    t = time.monotonic()
    ready = [
        ("q", (t, "Queue", "ns", "q", REGION, "q", None)),
        ("t", (t, "Topic", "ns", "t", REGION, "t", None)),
    ]
    for uid, entry in ready:
        scheduler.due[uid] = entry
    kept = scheduler._defer_busy(ready, t)
    assert [uid for uid, _ in kept] == ["t"]
    assert t + 0.6 <= scheduler.due["q"][0] <= t + 1.6  # due again once the waiting calls go
    now[0] += 1.0
    assert budget.backlog("sqs", REGION) == 0.0
    assert [uid for uid, _ in scheduler._defer_busy(ready, t)] == ["q", "t"]


def test_the_tagging_api_has_its_documented_budget():
    from provisioner.aws.budget import DEFAULT_LIMITS, parse_limits

    assert DEFAULT_LIMITS["resourcegroupstaggingapi"] == Limit(burst=15, rate=15)
    assert parse_limits("resourcegroupstaggingapi=off") == {"resourcegroupstaggingapi": None}


def test_resources_refused_for_their_generation_are_not_read_in_batches():
    a, b = resource("Queue", "a"), resource("Queue", "b")
    cloud = Tagged({a.external_name, b.external_name})
    rec = Reconciler(
        Settings(region=REGION, cluster_id="test", workers=2), None, {"Queue": cloud}, print
    )
    rec.states.of(a.uid).refused_for_generation = True  # InvalidSpec: its resync looks at nothing
    due = [(r.uid, r.region, r.external_name, None) for r in (a, b)]
    assert asyncio.run(rec.prefetch("Queue", due)) == 1
    assert cloud.batches == [[b.external_name]]
    rec.forget(a.uid)
    assert rec.states.get(a.uid) is None


def test_paused_resources_are_not_read_in_batches():
    """Paused means no cloud call names it: not even a batch the resync makes for others."""
    a, b = resource("Queue", "a"), resource("Queue", "b")
    cloud = Tagged({a.external_name, b.external_name})
    rec = Reconciler(
        Settings(region=REGION, cluster_id="test", workers=2), None, {"Queue": cloud}, print
    )
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {
            "namespace": a.namespace,
            "name": a.name,
            "uid": a.uid,
            "annotations": {"cloud.provisioner.dev/paused": "true"},
        },
        "spec": {},
    }
    rec.resource(body)  # every pass parses its body first: the pause is noted there
    due = [(r.uid, r.region, r.external_name, None) for r in (a, b)]
    assert asyncio.run(rec.prefetch("Queue", due)) == 1
    assert cloud.batches == [[b.external_name]]
    body["metadata"]["annotations"] = {}
    rec.resource(body)  # unpaused
    assert not rec.states.of(a.uid).paused
