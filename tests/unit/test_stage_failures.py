"""Stage failures: every exception a pass can meet becomes conditions, a Verdict and a
requeue (or none), on the way in and on the way out (`deleting`); a message never holds a
secret value."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.kinds import registry as kinds
from provisioner.kube.client import InvalidName, KubeError
from provisioner.model import conditions as cond
from provisioner.model.connection_secret import SecretConflict
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler import outcome
from provisioner.reconciler.failures import failure
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_CAP,
    Result,
    Verdict,
)

PASSWORD = "Secret0Password0Value00000000000"
# A retry far past where every backoff reaches its cap.
LATE = 40


@pytest.fixture
def no_jitter(monkeypatch):
    monkeypatch.setattr(outcome.random, "uniform", lambda a, b: 1.0)


def queue(status: dict[str, Any] | None = None) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {"namespace": "ns", "name": "q", "uid": "uid-q", "generation": 3},
        "spec": {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def by_type(result: Result) -> dict[str, tuple[bool, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in result.conditions}


def reasons(result: Result) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in result.conditions}


# -- the table: (exception, deleting) -> conditions, verdict, requeue cap ----------------

CASES = [
    # (id, exception, deleting, {type: (status, reason)}, verdict, cap or None, for_generation)
    (
        "account-not-found",
        AccountRefused(cond.ACCOUNT_NOT_FOUND, "CloudAccount x does not exist"),
        False,
        {cond.READY: (False, cond.ACCOUNT_NOT_FOUND), cond.SYNCED: (False, cond.ACCOUNT_NOT_FOUND)},
        Verdict.REFUSED_BY_ACCOUNT,
        CREDENTIALS_RETRY_CAP,
        True,
    ),
    (
        "account-refused-deleting",
        AccountRefused(cond.ACCOUNT_NOT_ALLOWED, "not selected"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.ACCOUNT_NOT_ALLOWED)},
        Verdict.REFUSED_BY_ACCOUNT,
        CREDENTIALS_RETRY_CAP,
        False,
    ),
    (
        "account-invalid-spec",
        AccountRefused(cond.INVALID_SPEC, "cannot move between accounts"),
        False,
        {cond.READY: (False, cond.INVALID_SPEC), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        None,
        True,
    ),
    (
        "account-invalid-spec-deleting",
        AccountRefused(cond.INVALID_SPEC, "cannot move between accounts"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        CREDENTIALS_RETRY_CAP,
        False,
    ),
    (
        "account-unavailable",
        errors.AccountUnavailableError("AssumeRole failed: AccessDenied"),
        False,
        {
            cond.READY: (False, cond.ACCOUNT_UNAVAILABLE),
            cond.SYNCED: (False, cond.ACCOUNT_UNAVAILABLE),
        },
        Verdict.REFUSED_BY_ACCOUNT,
        RETRY_CAP,
        True,
    ),
    (
        "invalid-name",
        InvalidName("Secret name", "a/b", "a DNS-1123 subdomain"),
        False,
        {cond.READY: (False, cond.UNAVAILABLE), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        None,
        True,
    ),
    (
        "invalid-name-deleting",
        InvalidName("Secret name", "a/b", "a DNS-1123 subdomain"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        CREDENTIALS_RETRY_CAP,
        False,
    ),
    (
        "terminal",
        errors.TerminalError("VisibilityTimeout too large", "InvalidAttributeValue"),
        False,
        {cond.READY: (False, cond.UNAVAILABLE), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        None,
        True,
    ),
    (
        "terminal-deleting",
        errors.TerminalError("cannot delete", "InvalidParameterCombination"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.INVALID_SPEC)},
        Verdict.INVALID_SPEC,
        CREDENTIALS_RETRY_CAP,
        False,
    ),
    (
        "conflict",
        errors.ConflictError("QueueAlreadyExists", "QueueNameExists"),
        False,
        {cond.READY: (False, cond.UNAVAILABLE), cond.SYNCED: (False, cond.NAME_CONFLICT)},
        Verdict.NAME_CONFLICT,
        None,
        True,
    ),
    (
        "name-held",
        errors.NameHeldError("deleted recently", "QueueDeletedRecently"),
        False,
        {cond.READY: (False, cond.CREATING), cond.SYNCED: (True, cond.RECONCILE_SUCCESS)},
        Verdict.WAITING,
        WAIT_CAP,
        True,
    ),
    (
        "name-held-deleting",
        errors.NameHeldError("deleted recently", "QueueDeletedRecently"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        False,
    ),
    (
        "credentials",
        errors.CredentialsError("Unable to locate credentials"),
        False,
        {cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        CREDENTIALS_RETRY_CAP,
        True,
    ),
    (
        "retryable",
        errors.RetryableError("Rate exceeded", "Throttling"),
        False,
        {cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        True,
    ),
    (
        "retryable-deleting",
        errors.RetryableError("Rate exceeded", "Throttling"),
        True,
        {cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        False,
    ),
    (
        "secret-conflict",
        SecretConflict("Secret q-connection exists and is not owned by this Queue"),
        False,
        {cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        True,
    ),
    (
        "kube",
        KubeError(500, "InternalError", "etcd timeout"),
        False,
        {cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        True,
    ),
    (
        "unexpected",
        RuntimeError("surprise"),
        False,
        {cond.SYNCED: (False, cond.RECONCILE_ERROR)},
        Verdict.FAILED,
        RETRY_CAP,
        True,
    ),
]


@pytest.mark.parametrize(
    ("exc", "deleting", "expected", "verdict", "cap", "for_generation"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_failure_maps_to_conditions_verdict_and_requeue(
    no_jitter, exc, deleting, expected, verdict, cap, for_generation
):
    result = failure(queue(), exc, LATE, deleting=deleting)
    assert reasons(result) == expected
    assert result.verdict is verdict
    assert result.requeue_after == cap
    assert result.for_generation is for_generation
    assert result.release_finalizer is False
    assert result.events == []


def test_a_first_retry_is_quick(no_jitter):
    assert failure(queue(), errors.RetryableError("x"), 0).requeue_after == outcome.RETRY_BASE
    held = failure(queue(), errors.NameHeldError("x"), 0)
    assert held.requeue_after == outcome.WAIT_BASE


def test_an_account_refusal_leaves_a_ready_that_status_shows():
    ready = {"type": cond.READY, "status": "True", "reason": cond.AVAILABLE}
    result = failure(queue({"conditions": [ready]}), AccountRefused(cond.ACCOUNT_NOT_FOUND, "x"), 0)
    assert reasons(result) == {cond.SYNCED: (False, cond.ACCOUNT_NOT_FOUND)}
    # Being deleted, Ready says so whatever it said before.
    leaving = failure(
        queue({"conditions": [ready]}),
        AccountRefused(cond.ACCOUNT_NOT_FOUND, "x"),
        0,
        deleting=True,
    )
    assert reasons(leaving)[cond.READY] == (False, cond.DELETING)


def test_account_messages_are_shown_as_given():
    refused = failure(queue(), AccountRefused(cond.ACCOUNT_NOT_FOUND, "CloudAccount x is gone"), 0)
    assert by_type(refused)[cond.SYNCED][2] == "CloudAccount x is gone"
    unavailable = failure(queue(), errors.AccountUnavailableError("denied", "AccessDenied"), 0)
    assert by_type(unavailable)[cond.SYNCED][2] == "AccessDenied: denied"


def test_the_cloud_refusing_the_spec_names_the_cloud_name():
    resource = queue()
    result = failure(resource, errors.TerminalError("too large", "InvalidAttributeValue"), 0)
    assert by_type(result)[cond.SYNCED][2] == (
        "the cloud refused the spec: InvalidAttributeValue: too large"
    )
    assert result.fields == {"externalName": resource.external_name}
    # Being deleted, nothing is written of the name.
    assert failure(resource, errors.TerminalError("x"), 0, deleting=True).fields == {}


def test_a_service_the_endpoint_lacks_is_said_plainly():
    result = failure(queue(), errors.NotSupportedError("RDS is not offered here"), 0)
    assert result.verdict is Verdict.INVALID_SPEC
    assert by_type(result)[cond.SYNCED][2] == "RDS is not offered here"


def test_a_held_name_says_when_it_tries_again(no_jitter):
    resource = queue()
    result = failure(resource, errors.NameHeldError("deleted 10 s ago", "QueueDeletedRecently"), 2)
    message = by_type(result)[cond.READY][2]
    assert resource.external_name in message
    assert "trying again in 8 s" in message
    assert result.fields == {"externalName": resource.external_name}


def test_retry_later_waits_as_long_as_the_cloud_says():
    exc = errors.RetryLaterError("storage changed within 6 hours", "InvalidParameter", 1234.0)
    result = failure(queue(), exc, 0)
    assert result.requeue_after == 1234.0
    assert result.verdict is Verdict.FAILED
    assert "trying again in 1234 s" in by_type(result)[cond.SYNCED][2]


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (errors.RetryableError("Rate exceeded", "Throttling"), "cloud call failed, will retry: "),
        (KubeError(500, "InternalError", "boom"), "Kubernetes API call failed, will retry: "),
        (errors.CredentialsError("no credentials"), "no credentials"),
        (SecretConflict("Secret s is not ours"), "Secret s is not ours"),
    ],
)
def test_retryable_messages(exc, message):
    assert by_type(failure(queue(), exc, 0))[cond.SYNCED][2].startswith(message)


def test_an_unexpected_error_never_shows_its_text(caplog):
    exc = RuntimeError(f"the endpoint rejected MasterUserPassword={PASSWORD}")
    result = failure(queue(), exc, 0)
    message = by_type(result)[cond.SYNCED][2]
    assert message == "unexpected error, will retry: RuntimeError"
    assert PASSWORD not in repr(result)
    # It is logged for the operator's own people, with its traceback.
    assert any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize("exc", [case[1] for case in CASES], ids=[case[0] for case in CASES])
def test_a_deletion_pass_never_claims_the_generation(exc):
    """A failed deletion says Deleting, and leaves observedGeneration where it was (the
    generation a deletion bumps was never reconciled)."""
    result = failure(queue(), exc, 0, deleting=True)
    assert reasons(result)[cond.READY] == (False, cond.DELETING)
    assert result.for_generation is False
    assert result.requeue_after is not None  # no spec change to wait for: retried


def test_a_name_conflict_while_deleting_is_retried(no_jitter):
    result = failure(queue(), errors.ConflictError("taken", "QueueNameExists"), LATE, True)
    assert result.verdict is Verdict.NAME_CONFLICT
    assert result.requeue_after == RETRY_CAP
