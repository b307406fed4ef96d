"""Every failure of a pass becomes conditions and a requeue; a message never holds a secret
value."""

from __future__ import annotations

import logging

from provisioner.aws import errors
from provisioner.kube.client import InvalidName, KubeError
from provisioner.model import conditions as cond
from provisioner.model import connection_secret
from provisioner.model.classes import ClassRefused
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_BASE,
    WAIT_CAP,
    Result,
    Verdict,
    at,
    backoff,
)

log = logging.getLogger(__name__)


def account_failure(
    resource: Resource,
    exc: AccountRefused | ClassRefused | errors.AccountUnavailableError,
    retry: int,
    deleting: bool,
) -> Result:
    """Refused before any cloud call, or AssumeRole failed. Looked at again when its
    CloudAccount, ResourceClass or namespace changes; meanwhile retried with a slow backoff."""
    if isinstance(exc, AccountRefused | ClassRefused):
        reason, message = exc.reason, exc.message
    else:
        reason, message = cond.ACCOUNT_UNAVAILABLE, str(exc)
    conditions = [cond.Condition(cond.SYNCED, False, reason, message)]
    if deleting:
        conditions.insert(0, cond.Condition(cond.READY, False, cond.DELETING, message))
    elif not cond.find(resource.status.get("conditions"), cond.READY):
        conditions.insert(0, cond.Condition(cond.READY, False, reason, message))
    if reason == cond.INVALID_SPEC and not deleting:
        # A new generation is the only way out.
        return Result(conditions=conditions, verdict=Verdict.INVALID_SPEC)
    cap = RETRY_CAP if reason == cond.ACCOUNT_UNAVAILABLE else CREDENTIALS_RETRY_CAP
    return Result(
        conditions=conditions,
        requeue_after=backoff(retry, cap=cap),
        for_generation=not deleting,
        verdict=Verdict.INVALID_SPEC if reason == cond.INVALID_SPEC else Verdict.REFUSED_BY_ACCOUNT,
    )


def refused(message: str, retry: int, deleting: bool) -> Result:
    """InvalidSpec: not retried until the spec changes; during deletion, where there is no
    spec change to wait for, retried slowly."""
    return Result(
        conditions=[
            cond.Condition(
                cond.READY, False, cond.DELETING if deleting else cond.UNAVAILABLE, message
            ),
            cond.Condition(cond.SYNCED, False, cond.INVALID_SPEC, message),
        ],
        requeue_after=backoff(retry, cap=CREDENTIALS_RETRY_CAP) if deleting else None,
        for_generation=not deleting,
        verdict=Verdict.INVALID_SPEC,
    )


def failure(resource: Resource, exc: Exception, retry: int, deleting: bool = False) -> Result:
    """Map a failure to conditions and a requeue; the message never holds a secret value."""
    if isinstance(exc, AccountRefused | ClassRefused | errors.AccountUnavailableError):
        return account_failure(resource, exc, retry, deleting)
    if isinstance(exc, InvalidName):
        # A name no Kubernetes object can have (one written at v1alpha1 before v1beta1's
        # rules were applied to it): nothing was requested with it.
        return refused(exc.message, retry, deleting)
    if isinstance(exc, errors.TerminalError):
        message = (
            str(exc)
            if isinstance(exc, errors.NotSupportedError)
            else f"the cloud refused the spec: {exc}"
        )
        result = refused(message, retry, deleting)
        if not deleting:  # the name the cloud was asked for, so that kubectl shows it
            result.fields["externalName"] = resource.external_name
        return result
    if isinstance(exc, errors.ConflictError):
        ready = cond.DELETING if deleting else cond.UNAVAILABLE
        return Result(
            conditions=[
                cond.Condition(cond.READY, False, ready, "the cloud name is taken"),
                cond.Condition(cond.SYNCED, False, cond.NAME_CONFLICT, str(exc)),
            ],
            requeue_after=backoff(retry) if deleting else None,
            for_generation=not deleting,
            verdict=Verdict.NAME_CONFLICT,
        )
    if isinstance(exc, errors.NameHeldError) and not deleting:
        delay = backoff(retry, WAIT_BASE, WAIT_CAP)
        message = (
            f"AWS still holds the name {resource.external_name} after a recent deletion "
            f"({exc}); trying again in {delay:.0f} s, at about {at(delay)}"
        )
        return Result(
            conditions=[
                cond.Condition(cond.READY, False, cond.CREATING, message),
                cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
            ],
            fields={"externalName": resource.external_name},
            requeue_after=delay,
            verdict=Verdict.WAITING,
        )
    return retryable(resource, exc, retry, deleting)


def retryable(resource: Resource, exc: Exception, retry: int, deleting: bool) -> Result:
    """A failure the next attempt may not have: ReconcileError, requeued."""
    delay = backoff(retry)
    if isinstance(exc, errors.RetryLaterError):
        delay = exc.retry_after
        message = f"{exc}; trying again in {delay:.0f} s, at about {at(delay)}"
    elif isinstance(exc, connection_secret.SecretConflict):
        message = str(exc)
    elif isinstance(exc, errors.CredentialsError):
        message = str(exc)
        delay = backoff(retry, cap=CREDENTIALS_RETRY_CAP)
    elif isinstance(exc, errors.CloudError):
        message = f"cloud call failed, will retry: {exc}"
    elif isinstance(exc, KubeError):
        message = f"Kubernetes API call failed, will retry: {exc}"
    else:
        log.exception("unexpected error reconciling %s %s", resource.kind, resource.ref)
        message = f"unexpected error, will retry: {type(exc).__name__}"
    conditions = [cond.Condition(cond.SYNCED, False, cond.RECONCILE_ERROR, message)]
    if deleting:
        conditions.insert(0, cond.Condition(cond.READY, False, cond.DELETING, message))
    return Result(
        conditions=conditions,
        requeue_after=delay,
        for_generation=not deleting,
        verdict=Verdict.FAILED,
    )
