"""Periodic looks give way to change passes, and a queued Event holds no body.

With thousands of resources, the looks coming due during a long burst of creates would
otherwise take a share of the API server and the cloud that grows with the number of
resources; and Events waiting for a slow API server would each hold a whole body."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Event, Result, event_reference
from provisioner.runtime.resync import ResyncScheduler

REGION = "us-east-1"


def reconciler(posted: list[tuple[dict[str, Any], Event]] | None = None) -> Reconciler:
    def post(body: dict[str, Any], event: Event) -> None:
        if posted is not None:
            posted.append((body, event))

    settings = Settings(region=REGION, cluster_id="test", workers=2, resync_seconds=300.0)
    return Reconciler(settings, None, {"Queue": object()}, post)  # type: ignore[arg-type, dict-item]


def test_a_look_waits_while_change_passes_fill_every_slot() -> None:
    rec = reconciler()
    scheduler = ResyncScheduler(rec, rec.settings, None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        assert rec.look_backlog("Queue", REGION) == 0.0
        entered = [asyncio.Event() for _ in range(3)]
        release = asyncio.Event()

        async def change(i: int) -> None:
            async with rec.workers.change_pass(f"uid-{i}"):
                entered[i].set()
                await release.wait()

        tasks = [asyncio.create_task(change(i)) for i in range(3)]
        await entered[0].wait()
        await entered[1].wait()
        # Both slots taken, a third change waits for one: the looks wait too.
        assert not entered[2].is_set()
        assert rec.workers.changes_in_flight == 3 and rec.workers.changes_busy
        wait = rec.look_backlog("Queue", REGION)
        assert 30.0 <= wait <= 300.0  # somewhere in the next period
        t = time.monotonic()
        ready = [("q", (t, "Queue", "ns", "q", REGION, "q", None))]
        scheduler.due["q"] = ready[0][1]
        assert scheduler._defer_busy(ready, t) == []
        assert t + 30.0 <= scheduler.due["q"][0] <= t + 301.0  # put off, not dropped
        release.set()
        await asyncio.gather(*tasks)
        assert rec.workers.changes_in_flight == 0 and not rec.workers.changes_busy
        assert rec.look_backlog("Queue", REGION) == 0.0
        assert [uid for uid, _ in scheduler._defer_busy(ready, t)] == ["q"]

    asyncio.run(scenario())


def test_a_change_pass_that_fails_gives_its_slot_back() -> None:
    rec = reconciler()

    async def scenario() -> None:
        try:
            async with rec.workers.change_pass("uid"):
                assert rec.workers.changes_in_flight == 1
                raise RuntimeError("the pass failed")
        except RuntimeError:
            pass
        assert rec.workers.changes_in_flight == 0

    asyncio.run(scenario())


def test_events_carry_a_reference_not_the_body() -> None:
    posted: list[tuple[dict[str, Any], Event]] = []
    rec = reconciler(posted)
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "Queue",
        "metadata": {
            "namespace": "ns",
            "name": "q",
            "uid": "uid-q",
            "generation": 1,
            "annotations": {"a": "x" * 10_000},
        },
        "spec": {"queueName": "q"},
        "status": {},
    }
    resource = kinds.parse(body, region=REGION, cluster_id="test")
    rec.emit(body, resource, Result(events=[Event("Normal", "Created", "created")]))
    assert [(ref, event.reason) for ref, event in posted] == [
        (
            {
                "apiVersion": "cloud.provisioner.dev/v1beta1",
                "kind": "Queue",
                "metadata": {"name": "q", "namespace": "ns", "uid": "uid-q"},
            },
            "Created",
        )
    ]
    assert event_reference({"kind": "CloudAccount", "metadata": {"name": "a", "uid": "u"}}) == {
        "kind": "CloudAccount",
        "metadata": {"name": "a", "uid": "u"},
    }


def test_events_waiting_for_the_api_server_are_bounded() -> None:
    from concurrent.futures import Future

    from provisioner.runtime.events import event_poster

    class Held:
        """An executor whose work waits until the test finishes it."""

        def __init__(self) -> None:
            self.futures: list[Future[None]] = []

        def submit(self, fn: Any, *args: Any) -> Future[None]:
            future: Future[None] = Future()
            self.futures.append(future)
            return future

    held = Held()

    class Kube:
        def post_event(self, *args: Any) -> None: ...

    post = event_poster(Kube(), held, backlog=3)  # type: ignore[arg-type]
    ref = {"kind": "Queue", "metadata": {"name": "q", "namespace": "ns", "uid": "u"}}
    for _ in range(5):
        post(ref, Event("Normal", "Created", "created"))
    assert len(held.futures) == 3  # two dropped
    held.futures[0].set_result(None)  # one posted: room for one more
    post(ref, Event("Normal", "Ready", "ready"))
    post(ref, Event("Normal", "Ready", "ready"))
    assert len(held.futures) == 4
