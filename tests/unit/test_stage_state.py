"""Stage state: one ResourceState record per uid, forgotten in one place (`States.forget`),
and which records the periodic looks skip."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from provisioner import API_VERSION
from provisioner.config import Settings
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.state import ResourceState, States
from tests.unit.fakes import FakeCloud, FakeKube

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
NS, NAME, UID = "team-a", "orders", "uid-orders"


def test_one_record_per_uid():
    states = States()
    first = states.of("a")
    assert states.of("a") is first
    assert states.of("b") is not first
    assert len(states) == 2
    assert "a" in states and "b" in states and "c" not in states


def test_get_makes_no_record():
    states = States()
    assert states.get("a") is None
    assert "a" not in states and len(states) == 0
    made = states.of("a")
    assert states.get("a") is made


def test_each_record_has_its_own_lock():
    states = States()
    assert states.of("a").lock is not states.of("b").lock
    assert isinstance(states.of("a").lock, asyncio.Lock)


def test_forget_removes_everything_remembered():
    states = States()
    state = states.of("a")
    state.pending_password = "Pending0Password0Value0000000000A"
    state.failed_resync = True
    state.recent_writes = {"spec.delaySeconds": (5, 1e12)}
    state.requeued = True
    state.refused_for_generation = True
    state.paused = True
    state.prefetched = (1.0, {"name": "a"})
    state.last_write = 42.0
    state.placed = ("team-a", "acct")
    state.refused = True
    states.forget("a")
    assert "a" not in states and states.get("a") is None and len(states) == 0
    fresh = states.of("a")
    assert fresh is not state
    # Every field back to its default: nothing of the old resource leaks into a new one.
    defaults = ResourceState()
    for f in dataclasses.fields(ResourceState):
        if f.name != "lock":
            assert getattr(fresh, f.name) == getattr(defaults, f.name), f.name
    assert fresh.lock is not state.lock


def test_forget_touches_only_that_uid_and_an_unknown_uid_is_fine():
    states = States()
    kept = states.of("b")
    kept.pending_password = "Kept0Password0Value00000000000000"
    states.of("a")
    states.forget("a")
    states.forget("never-seen")
    assert list(uid for uid, _ in states.items()) == ["b"]
    assert states.of("b") is kept and kept.pending_password


def test_items_is_a_snapshot_that_survives_forgetting_while_iterating():
    states = States()
    for uid in ("a", "b", "c"):
        states.of(uid)
    seen = []
    for uid, _ in states.items():
        seen.append(uid)
        states.forget(uid)
    assert seen == ["a", "b", "c"]
    assert len(states) == 0


@pytest.mark.parametrize(
    ("field", "skipped"),
    [
        ("requeued", True),
        ("refused_for_generation", True),
        ("paused", True),
        ("failed_resync", False),
        ("refused", False),
    ],
)
def test_looks_skipped(field, skipped):
    state = ResourceState()
    assert state.looks_skipped is False
    setattr(state, field, True)
    assert state.looks_skipped is skipped


def test_looks_skipped_ignores_what_is_only_remembered():
    state = ResourceState(pending_password="x" * 32, prefetched=(0.0, {}), placed=("ns", ""))
    assert state.looks_skipped is False


# -- the engine forgets a resource once its finalizer goes ---------------------------------


def _finalize(block_deletion: str) -> tuple[Reconciler, FakeCloud]:
    kube, cloud = FakeKube(), FakeCloud("Queue")
    body = {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {
            "namespace": NS,
            "name": NAME,
            "uid": UID,
            "generation": 1,
            "deletionTimestamp": "2030-01-01T00:00:00Z",
        },
        "spec": {"deletionPolicy": "Delete"},
        "status": {},
    }
    rec = Reconciler(SETTINGS, kube, {"Queue": cloud}, lambda *_: None)  # type: ignore[arg-type]
    cloud.seed(rec.resource(body))
    cloud.block_deletion = block_deletion
    rec.states.of(UID).pending_password = "Left0Over0Password0Value00000000"
    try:
        result, _ = asyncio.run(rec.finalize(body))
    finally:
        rec.executor.shutdown(wait=True)
        rec.look_executor.shutdown(wait=True)
    assert result.release_finalizer is (not block_deletion)
    return rec, cloud


def test_a_finished_deletion_forgets_the_resource():
    rec, cloud = _finalize("")
    assert cloud.writes() == ["delete"]
    assert UID not in rec.states


def test_a_deletion_that_waits_keeps_the_record():
    rec, cloud = _finalize("the bucket is not empty")
    assert cloud.writes() == ["delete"]
    assert UID in rec.states
