"""Stage outcome: the typed Verdict the schedulers and metrics read (never a condition's
reason), the Result a pass decides, and the helpers every stage shares."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from provisioner.aws import errors
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import conditions as cond
from provisioner.model.connection_secret import SecretConflict
from provisioner.model.resource import Dependency
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler import (
    dependencies,
    failures,
    guardrails,
    outcome,
    ownership,
    readiness,
)
from provisioner.reconciler.outcome import Event, Result, Verdict, at, event_reference, stamp
from provisioner.reconciler.outcome import where as where_
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import EVERYTHING_REQUESTED
from provisioner.runtime.handlers import _outcome

# The `result` labels of provisioner_reconcile_total (provisioner/runtime/metrics.py), by
# verdict: (not requeued, requeued).
LABELS = {
    Verdict.DONE: ("success", "requeue"),
    Verdict.WAITING: ("success", "requeue"),
    Verdict.NOT_APPLIED: ("error", "error"),
    Verdict.FAILED: ("error", "error"),
    Verdict.ACCESS_BLOCKED: ("error", "error"),
    Verdict.REFUSED_BY_ACCOUNT: ("error", "error"),
    Verdict.INVALID_SPEC: ("InvalidSpec", "InvalidSpec"),
    Verdict.NAME_CONFLICT: ("NameConflict", "NameConflict"),
    Verdict.PAUSED: ("Paused", "Paused"),
    Verdict.PLANNED: ("error", "error"),
}


def test_every_verdict_has_a_label():
    assert set(LABELS) == set(Verdict)


@pytest.mark.parametrize("verdict", list(Verdict))
@pytest.mark.parametrize("requeued", [False, True])
def test_metric_label(verdict, requeued):
    assert verdict.metric_label(requeued) == LABELS[verdict][requeued]


def test_metric_labels_are_those_the_metrics_document():
    documented = {"success", "requeue", "error", "InvalidSpec", "NameConflict", "Paused"}
    produced = {v.metric_label(r) for v in Verdict for r in (False, True)}
    assert produced == documented
    # The refusals are labelled with the Synced reason the runtime counts them by.
    assert Verdict.INVALID_SPEC.metric_label(False) == cond.INVALID_SPEC
    assert Verdict.NAME_CONFLICT.metric_label(False) == cond.NAME_CONFLICT
    assert Verdict.PAUSED.metric_label(True) == cond.PAUSED


def test_refused_for_generation_set():
    assert {v for v in Verdict if v.refused_for_generation} == {
        Verdict.INVALID_SPEC,
        Verdict.NAME_CONFLICT,
    }
    # The same refusals, as status says them after a restart (guardrails reads those).
    assert {v.value for v in Verdict if v.refused_for_generation} == set(
        cond.REFUSED_FOR_GENERATION
    )


def test_resync_retries_set():
    assert {v for v in Verdict if v.resync_retries} == {
        Verdict.FAILED,
        Verdict.NOT_APPLIED,
        Verdict.ACCESS_BLOCKED,
    }


def test_no_verdict_is_both_refused_and_retried():
    assert not [v for v in Verdict if v.refused_for_generation and v.resync_retries]


def test_result_defaults():
    result = Result()
    assert result.verdict is Verdict.DONE
    assert result.for_generation is True
    assert result.release_finalizer is False
    assert result.requeue_after is None
    assert (result.conditions, result.fields, result.events) == ([], {}, [])
    # Each Result has its own lists: one pass's Events never show up in another's.
    other = Result()
    result.events.append(Event("Normal", "Created", "x"))
    result.fields["a"] = 1
    assert other.events == [] and other.fields == {}


def test_retry_message_is_the_first_false_condition():
    result = Result(
        conditions=[
            cond.Condition(cond.READY, True, cond.AVAILABLE, "fine"),
            cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, "boom"),
            cond.Condition(cond.DRIFTED, False, cond.NO_DRIFT, "later"),
        ]
    )
    assert result.retry_message == "ReconcileError: boom"
    assert Result(conditions=[cond.Condition(cond.READY, True, "R")]).retry_message == "requeued"


def test_event_reference_keeps_only_what_an_event_needs():
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {
            "name": "q",
            "namespace": "ns",
            "uid": "u",
            "annotations": {"big": "x" * 1000},
            "resourceVersion": "7",
        },
        "spec": {"queueName": "q"},
        "status": {"conditions": []},
    }
    assert event_reference(body) == {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "q", "namespace": "ns", "uid": "u"},
    }
    assert event_reference({}) == {"metadata": {}}


def test_where():
    assert where_("acct") == "CloudAccount acct"
    assert where_("") == "the operator's own account"


def test_stamp_is_utc_whole_seconds():
    plus_two = timezone(timedelta(hours=2))
    assert stamp(datetime(2030, 1, 2, 5, 4, 5, 999999, tzinfo=plus_two)) == "2030-01-02T03:04:05Z"
    assert stamp(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2030-01-02T03:04:05Z"


def test_at_is_a_wall_clock_time():
    shown = at(3600)
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", shown)
    expected = datetime.now(UTC) + timedelta(seconds=3600)
    hours, minutes, seconds = (int(x) for x in shown[:-4].split(":"))
    got = hours * 3600 + minutes * 60 + seconds
    want = expected.hour * 3600 + expected.minute * 60 + expected.second
    # The same time of day, give or take the clock ticking between the two reads.
    assert min((got - want) % 86400, (want - got) % 86400) <= 2


def test_requeue_delays_are_ordered():
    assert outcome.RETRY_BASE < outcome.WAIT_BASE < outcome.WAIT_CAP < outcome.RETRY_CAP
    assert outcome.RETRY_CAP < outcome.CREDENTIALS_RETRY_CAP


# -- the label agrees with what the runtime counts ------------------------------------


def _stage_results() -> list[Result]:
    """Results as the stages build them, one of each way a pass ends (no deletion done:
    the runtime counts a released finalizer as `deleted`)."""
    body = {
        "kind": "DatabaseInstance",
        "metadata": {"namespace": "ns", "name": "db", "uid": "uid-db", "generation": 1},
        "spec": {"engine": "postgres", "instanceClass": "db.t3.micro"},
    }
    resource = kinds.parse(body, region="us-east-1", cluster_id="test")

    def progress() -> Progress:
        return Progress(resource, kinds.descriptor(resource.kind), 0, EVERYTHING_REQUESTED)

    available = Observation(exists=True, state="available")
    exceptions: list[Exception] = [
        AccountRefused(cond.ACCOUNT_NOT_FOUND, "no such account"),
        AccountRefused(cond.INVALID_SPEC, "cannot move"),
        errors.AccountUnavailableError("AssumeRole failed"),
        errors.TerminalError("bad value", "InvalidParameterValue"),
        errors.NotSupportedError("no RDS here"),
        errors.ConflictError("taken", "AlreadyExists"),
        errors.NameHeldError("held", "QueueDeletedRecently"),
        errors.RetryLaterError("storage changed recently", retry_after=600),
        errors.CredentialsError("no credentials"),
        errors.RetryableError("throttled", "Throttling"),
        SecretConflict("not ours"),
        RuntimeError("surprise"),
    ]
    results = [failures.failure(resource, exc, 2) for exc in exceptions]
    results += [failures.failure(resource, exc, 2, deleting=True) for exc in exceptions]
    results += [
        guardrails.paused(resource),
        dependencies.waiting_for(Dependency("k", "Queue", "dlq", "dead-letter Queue"), 0),
        ownership.name_conflict(resource, Observation(exists=True, owner_uid="other")),
        readiness.creating(progress()),
        readiness.not_applied(progress(), [FieldDiff("spec.allocatedStorageGiB", 20, 30)]),
        readiness.not_available(progress(), Observation(exists=True, state="creating")),
        readiness.not_available(progress(), Observation(exists=True, state="storage-full")),
        readiness.ready(progress(), available, None, False),
        readiness.ready(progress(), Observation(exists=True, settling=["spec.x"]), None, False),
        readiness.ready(
            progress(),
            available,
            cond.Condition(cond.SYNCED, False, cond.ACCESS_CONFLICT, "taken"),
            False,
        ),
        Result(for_generation=False),  # a repeat after a terminal refusal
    ]
    return results


def test_metric_label_agrees_with_the_runtimes_count():
    results = _stage_results()
    assert {r.verdict for r in results} == set(Verdict) - {Verdict.PLANNED}  # plan: its own file
    for result in results:
        label = result.verdict.metric_label(result.requeue_after is not None)
        assert label == _outcome(result), (result.verdict, result.conditions)
