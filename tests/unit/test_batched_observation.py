"""A batched describe stands in for a resync pass's own observation only when it is the
freshest word on the resource: taken after the last write the operator made, and recently."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import BatchObserver, Observation
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.observe import PREFETCH_TTL

SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)


class Batching:
    """A cloud that describes many at once; counts its calls."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.batches: list[list[str]] = []

    def describe_many(
        self, region: str, names: Sequence[str], account: Any = None
    ) -> dict[str, Any]:
        self.batches.append(list(names))
        return {n: {"name": n, "region": region} for n in names if n in self.names}

    def observed(self, resource: Any, described: Any) -> Observation:
        return Observation(exists=True, state="from-batch", arn=described["name"])


def resource(name: str) -> Any:
    body = {
        "kind": "DatabaseInstance",
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {"engine": "postgres", "instanceClass": "db.t3.micro"},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def reconciler(cloud: Batching) -> Reconciler:
    return Reconciler(SETTINGS, None, {"DatabaseInstance": cloud}, lambda *_: None)  # type: ignore[arg-type, dict-item]


def test_one_batch_serves_every_due_resource_that_exists():
    a, b, gone = resource("a"), resource("b"), resource("gone")
    cloud = Batching({a.external_name, b.external_name})
    assert isinstance(cloud, BatchObserver)
    rec = reconciler(cloud)
    due = [(r.uid, r.region, r.external_name, None) for r in (a, b, gone)]
    assert asyncio.run(rec.prefetch("DatabaseInstance", due)) == 2
    assert len(cloud.batches) == 1
    assert rec.observer.prefetched(cloud, a).state == "from-batch"
    assert rec.observer.prefetched(cloud, a) is None  # used once
    # Not found in a batch is no proof of absence: that pass observes by itself.
    assert rec.observer.prefetched(cloud, gone) is None


def test_an_answer_taken_before_a_write_is_never_used():
    a = resource("a")
    cloud = Batching({a.external_name})
    rec = reconciler(cloud)
    asyncio.run(rec.prefetch("DatabaseInstance", [(a.uid, a.region, a.external_name, None)]))
    rec.states.of(a.uid).last_write = time.monotonic()  # the change handler wrote in between
    assert rec.observer.prefetched(cloud, a) is None


def test_an_old_answer_is_never_used():
    a = resource("a")
    cloud = Batching({a.external_name})
    rec = reconciler(cloud)
    asyncio.run(rec.prefetch("DatabaseInstance", [(a.uid, a.region, a.external_name, None)]))
    started, described = rec.states.of(a.uid).prefetched
    rec.states.of(a.uid).prefetched = (started - PREFETCH_TTL - 1, described)
    assert rec.observer.prefetched(cloud, a) is None


def test_kinds_without_batches_are_left_alone():
    rec = Reconciler(SETTINGS, None, {"Queue": object()}, lambda *_: None)
    assert asyncio.run(rec.prefetch("Queue", [("u", "us-east-1", "q", None)])) == 0
    assert len(rec.states) == 0


def test_resyncs_due_soon_of_a_batched_kind_are_taken_along():
    from provisioner.runtime.resync import ResyncScheduler

    class Owner:
        clients = {"DatabaseInstance": Batching(set()), "Queue": object()}

    scheduler = ResyncScheduler(Owner(), Settings(resync_seconds=300.0), None, None)
    assert scheduler.batch_window == 30.0
    now = time.monotonic()
    for uid, kind, due in [
        ("db-due", "DatabaseInstance", now - 1),
        ("db-soon", "DatabaseInstance", now + 20),
        ("db-later", "DatabaseInstance", now + 40),
        ("q-soon", "Queue", now + 5),
    ]:
        scheduler.due[uid] = (due, kind, "ns", uid, "us-east-1", uid)
    taken = sorted(uid for uid, _ in scheduler._take_due(now))
    assert taken == ["db-due", "db-soon"]
    # Each is due again about one period on; the others keep their time.
    assert all(scheduler.due[u][0] > now + 250 for u in taken)
    assert scheduler.due["db-later"][0] == now + 40 and scheduler.due["q-soon"][0] == now + 5
    # Nothing of a batched kind due: nothing is taken early.
    assert scheduler._take_due(now) == []


def test_an_answer_taken_while_a_write_was_on_its_way_is_never_used():
    import threading

    a = resource("a")
    cloud = Batching({a.external_name})
    rec = reconciler(cloud)
    release = threading.Event()
    results = []

    def slow_update() -> None:
        release.wait(5)

    async def scenario() -> None:
        writing = asyncio.create_task(rec.workers.write(a.uid, slow_update))
        await asyncio.sleep(0.05)  # the write is on its way
        results.append(
            await rec.prefetch("DatabaseInstance", [(a.uid, a.region, a.external_name, None)])
        )
        release.set()
        await writing

    asyncio.run(scenario())
    assert results == [1]
    # The describe started before the write returned: it may not show it.
    assert rec.observer.prefetched(cloud, a) is None


def test_resources_their_change_handler_waits_on_are_not_described():
    a, b = resource("a"), resource("b")
    cloud = Batching({a.external_name, b.external_name})
    rec = reconciler(cloud)
    rec.states.of(a.uid).requeued = True  # `creating`: its own backoff polls it, no resync
    due = [(r.uid, r.region, r.external_name, None) for r in (a, b)]
    assert asyncio.run(rec.prefetch("DatabaseInstance", due)) == 1
    assert cloud.batches == [[b.external_name]]
    rec.states.of(b.uid).requeued = True
    assert asyncio.run(rec.prefetch("DatabaseInstance", due)) == 0
    assert len(cloud.batches) == 1  # nobody left to describe: no call at all
