"""What a pass decides: its Result (conditions, status fields, Events, a requeue), and the
requeue delays every stage uses."""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from provisioner.model import conditions as cond

# Requeue delays (seconds): the first retry is quick, then it doubles up to the cap.
RETRY_BASE = 1.0
RETRY_CAP = 60.0
CREDENTIALS_RETRY_CAP = 300.0
WAIT_BASE = 2.0
WAIT_CAP = 30.0


def event_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an Event needs of the object it is about (its kind, name and uid), not the
    body: an Event waits for its post, and a backlog of them (a burst of thousands of
    creates against a slow API server) would otherwise hold as many whole bodies."""
    meta = body.get("metadata") or {}
    reference: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind") if k in body}
    reference["metadata"] = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    return reference


def backoff(retry: int, base: float = RETRY_BASE, cap: float = RETRY_CAP) -> float:
    """Exponential backoff with +-20% jitter so that many resources spread out."""
    delay: float = min(cap, base * (2 ** min(retry, 16)))
    return round(delay * random.uniform(0.8, 1.2), 2)


def where(account: str) -> str:
    return f"CloudAccount {account}" if account else "the operator's own account"


def stamp(at: datetime) -> str:
    """A time as status and messages show it (RFC 3339, whole seconds, UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(delay: float) -> str:
    """The wall-clock time `delay` seconds from now, as people read it in a message."""
    return (datetime.now(UTC) + timedelta(seconds=delay)).strftime("%H:%M:%S UTC")


class Verdict(enum.Enum):
    """What a pass came to, as the schedulers and metrics read it (never from a condition's
    reason, which is worded for people)."""

    # In line with the spec, or nothing to do (a repeat after a terminal refusal).
    DONE = "done"
    # Waiting on the cloud or on a dependency: its change handler looks again by itself.
    WAITING = "waiting"
    # Written, but the cloud does not show it yet.
    NOT_APPLIED = "not-applied"
    # A failure that the next attempt may not have (the cloud, the API server, credentials).
    FAILED = "failed"
    # The resource serves; a grant of spec.access waits on something outside the spec.
    ACCESS_BLOCKED = "access-blocked"
    # Its CloudAccount or namespace does not let it act (or the account is unreachable).
    REFUSED_BY_ACCOUNT = "refused-by-account"
    # This generation is refused for good: only a new spec can change that.
    INVALID_SPEC = "InvalidSpec"
    NAME_CONFLICT = "NameConflict"
    PAUSED = "Paused"
    PLANNED = "planned"

    @property
    def refused_for_generation(self) -> bool:
        return self in (Verdict.INVALID_SPEC, Verdict.NAME_CONFLICT)

    @property
    def resync_retries(self) -> bool:
        """A resync that came to this looks again at the next resync, whatever its state."""
        return self in (Verdict.FAILED, Verdict.NOT_APPLIED, Verdict.ACCESS_BLOCKED)

    def metric_label(self, requeued: bool) -> str:
        """The `result` label of provisioner_reconcile_total."""
        if self in (Verdict.INVALID_SPEC, Verdict.NAME_CONFLICT, Verdict.PAUSED):
            return str(self.value)
        if self in (Verdict.DONE, Verdict.WAITING):
            return "requeue" if requeued else "success"
        return "error"


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Result:
    """What one pass decided: conditions, status fields, Events, and whether to come back."""

    conditions: list[cond.Condition] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # This pass dealt with the current generation, so status.observedGeneration moves to it.
    # False for passes that did not look at the spec (paused, deletion, a repeat after a
    # terminal error).
    for_generation: bool = True
    # Deletion is complete: the cloud resource is gone (or retained) and the finalizer may go.
    release_finalizer: bool = False
    verdict: Verdict = Verdict.DONE

    @property
    def retry_message(self) -> str:
        for c in self.conditions:
            if not c.status:
                return f"{c.reason}: {c.message}"
        return "requeued"


def placed(resource: Any) -> dict[str, Any]:
    """Where a pass placed its resource, as a trace's attributes."""
    account = resource.account
    return {
        "cloud.provider": "aws",
        "cloud.region": resource.region,
        "cloud.account.id": account.account_id if account is not None else "",
        "provisioner.account": account.name if account is not None else "",
        "provisioner.external_name": resource.external_name,
    }


def traced_outcome(result: Result) -> dict[str, Any]:
    """A pass's outcome as its trace's attributes: the verdict, the conditions it set, its
    Events' reasons, and the requeue."""
    return {
        "provisioner.verdict": result.verdict.value,
        "provisioner.conditions": [
            f"{c.type}={'True' if c.status else 'False'} ({c.reason})" for c in result.conditions
        ],
        "provisioner.events": [e.reason for e in result.events],
        "provisioner.requeue_after_seconds": result.requeue_after,
        "provisioner.release_finalizer": result.release_finalizer,
    }
