"""A create's own answer stands in for the read that used to follow it: for every kind it must
say exactly what a fresh observation of the new resource says, or the reconciler would act on
a picture of the cloud that is not there (a wrong ARN in the Secret, drift that is not real)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from provisioner.aws.session import CALLS
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import Observation
from provisioner.kinds.sqs import DEAD_LETTER_ARN

pytestmark = pytest.mark.cloud

SPECS: list[tuple[str, dict[str, Any]]] = [
    ("S3Bucket", {}),
    (
        "S3Bucket",
        {"versioning": True, "encryption": "aws:kms", "lifecycle": {"expireAfterDays": 9}},
    ),
    ("S3Bucket", {"blockPublicAccess": False}),
    ("Queue", {}),
    ("Queue", {"fifo": True, "visibilityTimeoutSeconds": 45, "delaySeconds": 3}),
    ("DatabaseInstance", {"engine": "postgres", "instanceClass": "db.t3.micro"}),
    ("Topic", {"displayName": "orders"}),
]


def comparable(obs: Observation) -> dict[str, Any]:
    """What the reconciler acts on (client_state is the client's own business)."""
    seen = dataclasses.asdict(obs)
    seen.pop("client_state")
    seen["diffs"] = sorted(d.field for d in obs.diffs)
    return seen


@pytest.mark.parametrize(
    ("kind", "spec"), SPECS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SPECS)]
)
def test_create_answer_is_what_a_fresh_observation_sees(aws, make_resource, kind, spec):
    client = kinds.make_clients(aws)[kind]
    resource = make_resource(kind, spec, tags={"team": "a"})
    secrets = {"password": "Create0Answer0Password0000000000"} if kind == "DatabaseInstance" else {}
    answer = client.create(resource, secrets)
    assert answer is not None, f"{kind}'s create does not say what it made"
    observed = client.observe(resource)
    assert answer.exists and answer.owned_by(resource)
    assert comparable(answer) == comparable(observed)
    client.delete(dataclasses.replace(resource, deletion_policy="Delete"), observed)


def test_queue_with_dead_letter_target_answers_its_redrive(aws, make_resource):
    client = kinds.make_clients(aws)["Queue"]
    target = make_resource("Queue", name="dlq")
    target_arn = client.create(target, {}).arn
    resource = make_resource("Queue", {"deadLetter": {"queueRef": {"name": "dlq"}}})
    linked = dataclasses.replace(resource, resolved={DEAD_LETTER_ARN: target_arn})
    answer = client.create(linked, {})
    assert comparable(answer) == comparable(client.observe(linked))
    assert answer.diffs == []


def test_queue_url_in_status_saves_the_lookup_and_a_gone_queue_is_seen_gone(aws, make_resource):
    client = kinds.make_clients(aws)["Queue"]
    resource = make_resource("Queue")
    url = client.create(resource, {}).status["queueUrl"]
    recorded = dataclasses.replace(resource, status={"queueUrl": url})

    before = Counter(CALLS.counts)
    assert client.observe(recorded).exists
    made = {(s, op): n for (s, op, _), n in (Counter(CALLS.counts) - before).items()}
    assert ("sqs", "GetQueueUrl") not in made, made
    assert made.get(("sqs", "GetQueueAttributes")) == 1, made

    # A URL recorded for another name (a changed spec) is not trusted.
    other = make_resource("Queue", name="other")
    elsewhere = dataclasses.replace(other, status={"queueUrl": url})
    assert client.observe(elsewhere).exists is False

    aws.client("sqs").delete_queue(QueueUrl=url)
    assert client.observe(recorded).exists is False
