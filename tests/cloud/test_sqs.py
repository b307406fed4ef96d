"""SqsClient against moto's server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.aws import errors
from provisioner.aws.session import CALLS
from provisioner.kinds.contract import PasswordClient
from provisioner.kinds.sqs import DEAD_LETTER_ARN, SqsClient

pytestmark = pytest.mark.cloud

CONNECTION_KEYS = {"queueUrl", "queueArn", "queueName", "region"}


@pytest.fixture
def sqs(aws):
    return SqsClient(aws)


def _raw_tags(aws, url):
    return aws.client("sqs").list_queue_tags(QueueUrl=url).get("Tags", {})


def test_lifecycle(aws, sqs, make_resource):
    res = make_resource("Queue", tags={"team": "a"})
    name = res.external_name
    assert sqs.observe(res).exists is False

    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.exists and obs.owned_by(res) and obs.available and not obs.deleting
    assert obs.diffs == []
    url = obs.connection["queueUrl"]
    assert _raw_tags(aws, url) == res.desired_tags
    assert set(obs.connection) == CONNECTION_KEYS
    assert obs.connection["queueName"] == name and obs.connection["region"] == "us-east-1"
    assert obs.connection["queueArn"] == obs.arn == f"arn:aws:sqs:us-east-1:123456789012:{name}"
    assert url.endswith(f"/{name}")
    assert obs.status == {"queueUrl": url}

    before = CALLS.total()
    sqs.update(res, obs, obs.diffs)  # up to date: no call at all
    assert CALLS.total() == before

    changed = replace(
        res,
        spec=replace(
            res.spec, visibility_timeout_seconds=60, message_retention_seconds=3600, delay_seconds=5
        ),
        user_tags={"env": "test"},
    )
    obs = sqs.observe(changed)
    assert {d.field for d in obs.diffs} == {
        "spec.visibilityTimeoutSeconds",
        "spec.messageRetentionSeconds",
        "spec.delaySeconds",
        "tags",
    }
    sqs.update(changed, obs, obs.diffs)
    assert sqs.observe(changed).diffs == []
    assert _raw_tags(aws, url) == changed.desired_tags  # "team" removed, "env" added

    assert not isinstance(sqs, PasswordClient)  # no password capability

    sqs.delete(changed, obs)
    assert sqs.observe(changed).exists is False
    sqs.delete(changed, obs)  # already gone: success


def test_fifo_queue(sqs, make_resource):
    res = make_resource("Queue", {"fifo": True})
    assert res.external_name.endswith(".fifo")
    sqs.create(res, {})
    obs = sqs.observe(res)
    assert obs.owned_by(res) and obs.diffs == []
    assert obs.client_state["attributes"]["FifoQueue"] == "true"
    sqs.delete(res, obs)


def test_dead_letter_redrive_set_changed_and_removed(sqs, make_resource):
    dlq = make_resource("Queue", name="dlq")
    sqs.create(dlq, {})
    dlq_arn = sqs.observe(dlq).arn
    res = make_resource(
        "Queue", {"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 3}}
    )

    linked = replace(res, resolved={DEAD_LETTER_ARN: dlq_arn})
    sqs.create(linked, {})
    assert sqs.observe(linked).diffs == []

    more = replace(linked, spec=replace(res.spec, max_receive_count=7))
    obs = sqs.observe(more)
    assert [
        (d.field, d.observed["maxReceiveCount"], d.desired["maxReceiveCount"]) for d in obs.diffs
    ] == [("spec.deadLetter", 3, 7)]
    sqs.update(more, obs, obs.diffs)
    assert sqs.observe(more).diffs == []

    unlinked = replace(more, resolved={})  # no dead letter target wanted any more
    obs = sqs.observe(unlinked)
    assert [(d.field, d.desired) for d in obs.diffs] == [("spec.deadLetter", None)]
    sqs.update(unlinked, obs, obs.diffs)
    obs = sqs.observe(unlinked)
    assert obs.diffs == [] and "RedrivePolicy" not in obs.client_state["attributes"]

    obs = sqs.observe(more)
    sqs.update(more, obs, obs.diffs)  # and set again on an existing queue
    assert sqs.observe(more).diffs == []


def test_foreign_queue_is_observed_not_owned(aws, sqs, make_resource):
    res = make_resource("Queue")
    aws.client("sqs").create_queue(QueueName=res.external_name, Attributes={"DelaySeconds": "9"})
    obs = sqs.observe(res)
    assert obs.exists and obs.owner_uid == "" and not obs.owned_by(res)
    with pytest.raises(errors.ConflictError):  # different attributes: QueueAlreadyExists
        sqs.create(res, {})
