"""Stage: readiness. What a converged pass reports: creating, not available (yet), written
but not applied by the cloud yet, or Ready with its Secret and grants; and when to look
again."""

from __future__ import annotations

from provisioner.access.grants import Access
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import conditions as cond
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_BASE,
    WAIT_CAP,
    Event,
    Result,
    Verdict,
    backoff,
)
from provisioner.reconciler.progress import Progress


def creating(p: Progress) -> Result:
    """Created, not visible yet."""
    name = p.resource.external_name
    return Result(
        conditions=[cond.Condition(cond.READY, False, cond.CREATING, f"creating {name}")],
        fields={"externalName": name},
        events=p.events,
        requeue_after=backoff(p.retry, WAIT_BASE, WAIT_CAP),
        verdict=Verdict.WAITING,
    )


def not_available(p: Progress, obs: Observation) -> Result:
    """The resource exists but does not serve yet (or any more): wait and look again."""
    starting = obs.state in kinds.descriptor(p.resource.kind).creating_states
    return Result(
        conditions=[
            cond.Condition(
                cond.READY,
                False,
                cond.CREATING if starting else cond.UNAVAILABLE,
                f"{p.resource.external_name} is {obs.state or 'not ready'}",
            ),
            cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS),
            *p.conditions,
        ],
        fields=p.fields,
        events=p.events,
        requeue_after=backoff(p.retry, WAIT_BASE, WAIT_CAP),
        verdict=Verdict.WAITING,
    )


def not_applied(p: Progress, pending: list[FieldDiff]) -> Result:
    """Written, but the cloud does not show it yet: Synced=False until it does."""
    described = "; ".join(d.describe() for d in pending)
    return Result(
        conditions=[
            cond.Condition(
                cond.READY, True, cond.AVAILABLE, f"{p.resource.external_name} is available"
            ),
            cond.Condition(
                cond.SYNCED,
                False,
                cond.RECONCILE_ERROR,
                f"the cloud has not applied: {described}",
            ),
            *p.conditions,
        ],
        fields=p.fields,
        events=p.events,
        requeue_after=backoff(p.retry),
        verdict=Verdict.NOT_APPLIED,
    )


async def grant(p: Progress, access: Access | None, arn: str) -> tuple[cond.Condition | None, bool]:
    """Stage: access. The grants of spec.access (status.access, their Events); the problem
    a grant waits on, and whether it may go away by itself."""
    if access is None:
        return None, False
    granted = await access.converge(p.resource, arn)
    if granted is None:
        return None, False
    p.fields["access"] = granted.entries
    p.events += [Event(*e) for e in granted.events]
    return granted.problem, granted.retry


def ready(p: Progress, obs: Observation, problem: cond.Condition | None, retry: bool) -> Result:
    """Available and in line with the spec, its Secret written: Ready."""
    resource = p.resource
    available = (
        f"{resource.external_name} is available; "
        f"connection Secret {resource.secret_name} is written"
    )
    if obs.applying:
        available += f"; the cloud is applying: {obs.applying}"
    synced = ""
    requeue_after = None
    if obs.settling:
        # Written just now; reads may lag (SQS: up to 60 s). Look again to confirm.
        settle = kinds.descriptor(resource.kind).settle_seconds
        synced = (
            f"written: {', '.join(obs.settling)}; the cloud may show the previous value "
            f"for up to {settle:.0f} s"
        )
        requeue_after = backoff(p.retry, WAIT_BASE, WAIT_CAP)
    if problem is not None:
        # The resource serves; a grant waits on something outside the spec. Looked at
        # again with a backoff (a conflict, which people must resolve, slowly).
        delay = backoff(p.retry, cap=RETRY_CAP if retry else CREDENTIALS_RETRY_CAP)
        requeue_after = min(requeue_after or delay, delay)
    return Result(
        conditions=[
            cond.Condition(cond.READY, True, cond.AVAILABLE, available),
            problem or cond.Condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS, synced),
            *p.conditions,
        ],
        fields=p.fields,
        events=p.events,
        requeue_after=requeue_after,
        verdict=Verdict.DONE if problem is None else Verdict.ACCESS_BLOCKED,
    )
