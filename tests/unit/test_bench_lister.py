"""bench/lib/workload.Lister: one LIST, then a WATCH per kind kept as a cache; a round reads it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from bench.lib.workload import Cr, Lister


def item(namespace: str, name: str, version: str, ready: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"namespace": namespace, "name": name, "resourceVersion": version},
        "status": {"conditions": conditions},
    }


class FakeApi:
    """A LIST of one queue, then one WATCH with the events given; later WATCHes wait."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.watches: list[str] = []
        self.consumed = threading.Event()  # the first WATCH was read to its end
        self.stop = threading.Event()

    def json(self, method: str, path: str) -> dict[str, Any]:
        assert (method, path) == ("GET", "/apis/cloud.provisioner.dev/v1beta1/queues")
        return {"metadata": {"resourceVersion": "10"}, "items": [item("ns", "a", "10")]}

    def watch(self, path: str, version: str, timeout_seconds: int = 60) -> Iterator[dict[str, Any]]:
        self.watches.append(version)
        if len(self.watches) == 1:
            yield from self.events
            return
        self.consumed.set()
        self.stop.wait(5.0)


def test_a_round_reads_what_the_watch_delivered() -> None:
    crs = [Cr("Queue", "queues", "ns", name) for name in ("a", "b", "c")]
    api = FakeApi(
        [
            {"type": "ADDED", "object": item("ns", "b", "11")},
            {"type": "ADDED", "object": item("other", "x", "12")},  # not one of ours
            {"type": "MODIFIED", "object": item("ns", "a", "13", ready=True)},
            {"type": "ADDED", "object": item("ns", "c", "14")},
            {"type": "DELETED", "object": item("ns", "c", "15")},
        ]
    )
    lister = Lister(api, crs)
    lister.start(timeout=5.0)
    try:
        assert api.consumed.wait(5.0)
        seen = {cr.name: (item, now, since) for cr, item, now, since in lister.round()}
        assert sorted(seen) == ["a", "b"]
        a, now, since = seen["a"]
        assert a["metadata"]["resourceVersion"] == "13"
        assert since <= now  # arrived before the round
        assert api.watches == ["10", "15"]  # watched on from the LIST, then from the last event
        assert lister.lists == 1 and lister.events == 5 and lister.rounds == 1
    finally:
        api.stop.set()
        lister.stop()
