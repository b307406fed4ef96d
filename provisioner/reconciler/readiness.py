"""Stage: readiness. What a converged pass reports: creating, not available (yet), written
but not applied by the cloud yet, or Ready with its Secret and grants; and when to look
again. What differs by kind (the state words of a resource still being made, how long a
write may take to show) comes from the kind contract."""

from __future__ import annotations

from typing import Any

from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import (
    CREDENTIALS_RETRY_CAP,
    RETRY_CAP,
    WAIT_BASE,
    WAIT_CAP,
    Result,
    Verdict,
    backoff,
)
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import Requested


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


def waiting(p: Progress, obs: Observation) -> Result | None:
    """The Result of a resource that does not serve yet, or whose changes the cloud does not
    show yet; None when it serves in line with the spec."""
    if obs.deleting or not obs.available:
        return not_available(p, obs)
    pending = [d for d in obs.diffs if not reported_only(p.resource, d, p.requested)]
    return not_applied(p, pending) if pending else None


def reported_only(resource: Resource, diff: FieldDiff, requested: Requested) -> bool:
    """Drift that `drift-policy: report` leaves in place (a requested change never is)."""
    return resource.drift_report_only and not requested.covers(diff.field)


def not_available(p: Progress, obs: Observation) -> Result:
    """The resource exists but does not serve yet (or any more): wait and look again."""
    starting = obs.state in p.kind.creating_states
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
        settle = p.kind.settle_seconds
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


def class_field(resource: Resource) -> dict[str, Any]:
    """status.class: the ResourceClass the pass completed the spec from (removed when none
    applies any more)."""
    if resource.class_use is not None:
        return {"class": resource.class_use.status}
    return {"class": None} if "class" in resource.status else {}
