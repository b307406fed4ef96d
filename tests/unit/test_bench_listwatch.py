"""bench/lib/listwatch.ListWatch: LIST, then WATCH from the list's version and on from the last
one seen; a bookmark moves the version only; 410 Gone and failures LIST again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from bench.lib.listwatch import ListWatch

PATH = "/apis/cloud.provisioner.dev/v1beta1/queues"


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": version}}


class ScriptedApi:
    """LISTs answer versions 10, 20, ...; each WATCH plays the next script (a list of events,
    or an exception to raise); once they are used up, WATCHes wait until `stop` is set."""

    def __init__(self, scripts: list[list[dict[str, Any]] | Exception]) -> None:
        self.scripts = scripts
        self.lists = 0
        self.watches: list[str] = []
        self.done = threading.Event()  # every script was played
        self.stop = threading.Event()

    def json(self, method: str, path: str) -> dict[str, Any]:
        assert (method, path) == ("GET", PATH)
        self.lists += 1
        version = str(10 * self.lists)
        return {"metadata": {"resourceVersion": version}, "items": [obj("a", version)]}

    def watch(self, path: str, version: str, timeout_seconds: int = 60) -> Iterator[dict[str, Any]]:
        self.watches.append(version)
        if len(self.watches) > len(self.scripts):
            self.done.set()
            self.stop.wait(5.0)
            return
        script = self.scripts[len(self.watches) - 1]
        if isinstance(script, Exception):
            raise script
        yield from script


def test_bookmarks_move_on_and_gone_or_failure_lists_again() -> None:
    api = ScriptedApi(
        [
            [
                {"type": "ADDED", "object": obj("b", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ],  # ends (the API server's timeout): on from 12
            [
                {"type": "MODIFIED", "object": obj("b", "13")},
                {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}},
                {"type": "ADDED", "object": obj("never", "14")},  # after the ERROR: not read
            ],
            RuntimeError("WATCH: connection refused"),
            [{"type": "DELETED", "object": obj("b", "31")}],
        ]
    )
    listed: list[tuple[str, list[str]]] = []
    seen: list[tuple[str, str, str]] = []
    watch = ListWatch(
        api,
        {"queues": PATH},
        lambda name, items, at: listed.append((name, [i["metadata"]["name"] for i in items])),
        lambda name, kind, o: seen.append((name, kind, o["metadata"]["name"])),
        pause=0.01,
    )
    assert watch.start().wait_listed(5.0)
    try:
        assert api.done.wait(5.0)
        assert api.watches == ["10", "12", "20", "30", "31"]
        assert listed == [("queues", ["a"])] * 3
        assert seen == [
            ("queues", "ADDED", "b"),
            ("queues", "MODIFIED", "b"),
            ("queues", "DELETED", "b"),
        ]
        assert (watch.lists, watch.events, watch.restarts) == (3, 4, 3)
        assert watch.errors == ["queues: WATCH: connection refused"]
    finally:
        api.stop.set()
        watch.stop()


def test_wait_listed_is_false_while_a_list_fails() -> None:
    class Refused(ScriptedApi):
        def json(self, method: str, path: str) -> dict[str, Any]:
            raise RuntimeError("GET: 503")

    watch = ListWatch(Refused([]), {"queues": PATH}, lambda *a: None, lambda *a: None, pause=0.01)
    assert not watch.start().wait_listed(0.2)
    watch.stop()
    assert watch.errors[0] == "queues: GET: 503"
