"""provisioner.reconciler.engine: backoff and the static predicates on a Resource's status; the
resync due times of resumed resources."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import conditions as cond
from provisioner.reconciler import guardrails, outcome
from provisioner.reconciler.outcome import backoff
from provisioner.runtime.resync import ResyncScheduler

UID = "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"


# -- backoff ------------------------------------------------------------------------


@pytest.fixture
def no_jitter(monkeypatch):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)


def test_backoff_doubles_then_caps(no_jitter):
    delays = [backoff(r, 1.0, 60.0) for r in range(10)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]


def test_backoff_uses_base_and_cap(no_jitter):
    assert [backoff(r, 2.0, 30.0) for r in range(6)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(0) == outcome.RETRY_BASE
    assert backoff(100) == outcome.RETRY_CAP


def test_backoff_huge_retry_does_not_overflow(no_jitter):
    assert backoff(10**9, 1.0, 300.0) == 300.0


@pytest.mark.parametrize("factor", [0.8, 1.2])
def test_backoff_jitter_extremes(monkeypatch, factor):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: factor)
    assert backoff(3, 1.0, 60.0) == pytest.approx(8.0 * factor)
    assert backoff(50, 1.0, 60.0) == pytest.approx(60.0 * factor)


def test_backoff_asks_for_plus_minus_20_percent(monkeypatch):
    seen = []

    def fake_uniform(a, b):
        seen.append((a, b))
        return a

    monkeypatch.setattr(outcome.random, "uniform", fake_uniform)
    backoff(2)
    assert seen == [(0.8, 1.2)]


@pytest.mark.parametrize(("base", "cap"), [(1.0, 60.0), (2.0, 30.0), (2.0, 15.0), (1.0, 300.0)])
def test_property_backoff_within_jitter_band_and_never_above_cap(base, cap):
    random.seed(99)
    for retry in range(0, 40):
        nominal = min(cap, base * 2**retry)
        for _ in range(25):
            delay = backoff(retry, base, cap)
            assert nominal * 0.8 - 0.005 <= delay <= nominal * 1.2 + 0.005
            assert delay <= cap * 1.2
            assert delay > 0


def test_backoff_grows_on_average():
    random.seed(5)
    means = [sum(backoff(r, 1.0, 60.0) for _ in range(200)) / 200 for r in range(7)]
    assert means == sorted(means)
    assert means[-1] > 5 * means[0]


# -- terminal_for_generation / settled -------------------------------------------------


def resource(generation=3, status=None):
    body = {
        "kind": "S3Bucket",
        "metadata": {"namespace": "ns", "name": "b", "uid": UID, "generation": generation},
        "spec": {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="c")


def synced(status, reason, gen):
    return {
        "type": "Synced",
        "status": status,
        "reason": reason,
        "message": "",
        "observedGeneration": gen,
    }


def ready(status="True", gen=3):
    return {"type": "Ready", "status": status, "reason": "R", "observedGeneration": gen}


@pytest.mark.parametrize("reason", [cond.INVALID_SPEC, cond.NAME_CONFLICT])
def test_terminal_for_generation_true(reason):
    r = resource(3, {"conditions": [ready("False"), synced("False", reason, 3)]})
    assert guardrails.terminal_for_generation(r) is True


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"conditions": None},
        {"conditions": [ready("False")]},
        # a newer generation: the user changed the spec, so try again
        {"conditions": [synced("False", cond.INVALID_SPEC, 2)]},
        # a retryable failure is not terminal
        {"conditions": [synced("False", cond.RECONCILE_ERROR, 3)]},
        {"conditions": [synced("False", cond.PAUSED, 3)]},
        # succeeded
        {"conditions": [synced("True", cond.RECONCILE_SUCCESS, 3)]},
        {"conditions": [synced("True", cond.INVALID_SPEC, 3)]},
        # observedGeneration missing
        {"conditions": [{"type": "Synced", "status": "False", "reason": cond.INVALID_SPEC}]},
    ],
)
def test_terminal_for_generation_false(status):
    assert guardrails.terminal_for_generation(resource(3, status)) is False


def test_settled_true():
    r = resource(4, {"observedGeneration": 4, "conditions": [synced("True", "X", 4)]})
    assert guardrails.settled(r) is True


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"observedGeneration": 4},
        {"observedGeneration": 4, "conditions": [ready("True", 4)]},
        {"observedGeneration": 4, "conditions": [synced("False", cond.RECONCILE_ERROR, 4)]},
        {"observedGeneration": 3, "conditions": [synced("True", cond.RECONCILE_SUCCESS, 3)]},
        {"conditions": [synced("True", cond.RECONCILE_SUCCESS, 4)]},
    ],
)
def test_settled_false(status):
    assert guardrails.settled(resource(4, status)) is False


def at_rest_resource(annotations=None, status=None, generation=4):
    body = {
        "kind": "S3Bucket",
        "metadata": {
            "namespace": "ns",
            "name": "b",
            "uid": UID,
            "generation": generation,
            "annotations": annotations or {},
        },
        "spec": {},
        "status": {
            "observedGeneration": 4,
            "conditions": [ready("True", 4), synced("True", cond.RECONCILE_SUCCESS, 4)],
            **(status or {}),
        },
    }
    return body, kinds.parse(body, region="us-east-1", cluster_id="c")


def test_at_rest_true():
    body, r = at_rest_resource(
        {
            "cloud.provisioner.dev/reconcile-requested-at": "1",
            "cloud.provisioner.dev/rotate-password-at": "2",
            "cloud.provisioner.dev/paused": "false",
        },
        {"lastReconcileRequest": "1", "lastPasswordRotation": "2"},
    )
    assert guardrails.at_rest(r, body) is True


@pytest.mark.parametrize(
    "annotations, status, generation, deleting",
    [
        ({}, {}, 5, False),  # a spec not handled yet
        ({}, {"conditions": [ready("False", 4), synced("True", "X", 4)]}, 4, False),
        ({}, {"conditions": [ready("True", 4), synced("False", cond.PAUSED, 4)]}, 4, False),
        ({}, {"conditions": [synced("True", "X", 4)]}, 4, False),  # no Ready at all
        ({"cloud.provisioner.dev/paused": "true"}, {}, 4, False),
        ({"cloud.provisioner.dev/reconcile-requested-at": "1"}, {}, 4, False),
        ({"cloud.provisioner.dev/rotate-password-at": "2"}, {}, 4, False),
        ({}, {}, 4, True),
    ],
)
def test_at_rest_false(annotations, status, generation, deleting):
    body, r = at_rest_resource(annotations, status, generation)
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert guardrails.at_rest(r, body) is False


def test_resumed_resources_spread_over_one_period_after_its_first_tenth():
    settings = Settings(resync_seconds=300.0)
    scheduler = ResyncScheduler(None, settings, None, None)
    delays = []
    for i in range(2000):
        _, r = at_rest_resource()
        r = dataclasses.replace(r, uid=f"u{i}")
        delays.append(scheduler.track_resumed(r))
        assert abs(scheduler.due[r.uid][0] - (time.monotonic() + delays[-1])) < 1.0
    assert len(scheduler.due) == 2000
    assert 30.0 <= min(delays) and max(delays) <= 330.0
    # Uniform: each tenth of the period holds about a tenth of them.
    for lo in range(30, 330, 30):
        share = sum(lo <= d < lo + 30 for d in delays) / len(delays)
        assert 0.06 < share < 0.14, (lo, share)
    assert scheduler.calm_resume
    assert not ResyncScheduler(None, Settings(resync_seconds=0), None, None).calm_resume


def test_terminal_and_settled_are_exclusive():
    for status in ("True", "False"):
        for reason in (cond.INVALID_SPEC, cond.RECONCILE_SUCCESS):
            r = resource(2, {"observedGeneration": 2, "conditions": [synced(status, reason, 2)]})
            assert not (guardrails.terminal_for_generation(r) and guardrails.settled(r))


def test_result_retry_message():
    result = outcome.Result(
        conditions=[
            cond.Condition(cond.READY, True, cond.AVAILABLE, "ok"),
            cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, "boom"),
        ]
    )
    assert result.retry_message == "ReconcileError: boom"
    assert outcome.Result().retry_message == "requeued"
