"""Stage expiry: status.expiresAt and the condition Expiring, a Warning Event when it begins,
and the resource due for deletion by the API server's clock (not this machine's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler.expiry import Expiry
from provisioner.reconciler.outcome import Event, Result
from tests.unit.fakes import FakeKube

CREATED = datetime(2030, 1, 1, 0, 0, 0, tzinfo=UTC)
SETTINGS = Settings(region="us-east-1", cluster_id="test", expiry_warning_seconds=3600.0)


class ClockKube(FakeKube):
    """The API server's clock, set by the test."""

    def __init__(self, now: datetime) -> None:
        super().__init__()
        self.now = now

    def server_now(self) -> datetime:
        return self.now


def resource(
    ttl: str | None = None,
    expires_at: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    policy: str = "Delete",
) -> Resource:
    spec: dict[str, Any] = {"deletionPolicy": policy}
    if ttl:
        spec["ttl"] = ttl
    if expires_at:
        spec["expiresAt"] = expires_at
    body = {
        "kind": "Queue",
        "metadata": {
            "namespace": "ns",
            "name": "q",
            "uid": "uid-q",
            "generation": 1,
            "creationTimestamp": "2030-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": {"conditions": conditions or []},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def expiry(now: datetime) -> Expiry:
    return Expiry(ClockKube(now), SETTINGS)  # type: ignore[arg-type]


def report(r: Resource, now: datetime) -> Result:
    result = Result()
    expiry(now).report(r, result)
    return result


def shown(result: Result) -> list[tuple[str, bool, str]]:
    return [(c.type, c.status, c.reason) for c in result.conditions]


EXPIRING_TRUE = {"type": cond.EXPIRING, "status": "True", "reason": cond.EXPIRES_SOON}


def test_no_expiry():
    result = report(resource(), CREATED)
    assert result.fields == {"expiresAt": None}
    assert result.conditions == [] and result.events == []


def test_an_expiry_removed_clears_expiring():
    result = report(resource(conditions=[EXPIRING_TRUE]), CREATED)
    assert result.fields == {"expiresAt": None}
    assert shown(result) == [(cond.EXPIRING, False, cond.EXPIRY_SCHEDULED)]
    assert result.conditions[0].message == "no expiry"
    assert result.events == []


def test_an_expiry_far_off_is_scheduled():
    result = report(resource(ttl="7d"), CREATED)
    assert result.fields == {"expiresAt": "2030-01-08T00:00:00Z"}
    assert shown(result) == [(cond.EXPIRING, False, cond.EXPIRY_SCHEDULED)]
    assert result.conditions[0].message == "deleted at 2030-01-08T00:00:00Z"
    assert result.events == []


def test_an_expiry_close_warns_once():
    r = resource(ttl="7d", policy="Retain")
    now = CREATED + timedelta(days=7) - timedelta(seconds=600)
    result = report(r, now)
    assert shown(result) == [(cond.EXPIRING, True, cond.EXPIRES_SOON)]
    message = "deleted at 2030-01-08T00:00:00Z (in 600 s); deletionPolicy Retain"
    assert result.conditions[0].message == message
    assert result.events == [Event("Warning", "Expiring", message)]
    # Already said: the condition stays, no second Event.
    again = report(resource(ttl="7d", policy="Retain", conditions=[EXPIRING_TRUE]), now)
    assert shown(again) == [(cond.EXPIRING, True, cond.EXPIRES_SOON)]
    assert again.events == []


def test_an_expiry_past_says_zero_seconds_left():
    r = resource(expires_at="2030-01-01T01:00:00Z")
    result = report(r, CREATED + timedelta(hours=2))
    assert "(in 0 s)" in result.conditions[0].message


def test_warning_seconds_is_the_setting_or_half_a_short_lifetime():
    assert expiry(CREATED).warning_seconds(resource(ttl="7d")) == 3600.0
    assert expiry(CREATED).warning_seconds(resource(ttl="20m")) == 600.0
    assert expiry(CREATED).warning_seconds(resource()) == 3600.0


def test_a_short_lifetime_warns_at_its_half():
    r = resource(ttl="20m")
    assert shown(report(r, CREATED + timedelta(minutes=9)))[0][1] is False
    assert shown(report(r, CREATED + timedelta(minutes=11)))[0][1] is True


@pytest.mark.parametrize(
    ("now", "due"),
    [
        (CREATED + timedelta(hours=1) - timedelta(seconds=1), False),
        (CREATED + timedelta(hours=1), True),
        (CREATED + timedelta(hours=2), True),
    ],
)
def test_due_by_the_api_servers_clock(now, due):
    assert expiry(now).due(resource(ttl="1h")) is due


def test_never_due_without_an_expiry():
    assert expiry(CREATED + timedelta(days=999)).due(resource()) is False


def test_expired_event():
    event = Expiry.expired(resource(ttl="1h", policy="Retain"))
    assert event == Event(
        "Normal", "Expired", "expired at 2030-01-01T01:00:00Z: deleted, deletionPolicy Retain"
    )
