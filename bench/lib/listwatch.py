"""Collections of the API server kept in view: LIST, then WATCH from the list's resourceVersion.

One thread per collection. It LISTs, hands the items over, then WATCHes from the list's
resourceVersion and hands over every ADDED, MODIFIED and DELETED object as it arrives; a
BOOKMARK (the watches ask for them) only moves the version on. When a WATCH ends (the API
server closes it after `watch_seconds`) the next one starts from the last version seen; when
it answers ERROR (410 Gone: that version is no longer kept) or anything fails (the API server
restarting), the thread LISTs again, after a pause for a failure. `stop()` ends every thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

Item = dict[str, Any]
# (collection's name, the items of a LIST, the wall-clock time its answer arrived)
OnList = Callable[[str, list[Item], float], None]
# (collection's name, event type: ADDED, MODIFIED or DELETED, the object)
OnEvent = Callable[[str, str, Item], None]
# Errors kept (the first ones), each cut to this many characters.
MAX_ERRORS = 20
ERROR_CHARS = 300


class WatchApi(Protocol):
    """What the loop needs of the API (provisioner_dev.kubejson.KubeJson has it)."""

    def json(self, method: str, path: str) -> dict[str, Any]: ...

    def watch(
        self, path: str, resource_version: str, timeout_seconds: int = 60
    ) -> Iterator[dict[str, Any]]: ...


def version_of(obj: Item) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class ListWatch:
    """LIST-then-WATCH of each collection of `paths` (name -> API path), a thread each.

    Counters, over every collection: `lists` and `list_seconds` (the LISTs and their time),
    `events` (every WATCH event but ERROR, bookmarks included), `restarts` (WATCHes that
    ended, by the API server's timeout or an ERROR), `errors` (the first failures, named).
    """

    def __init__(
        self,
        api: WatchApi,
        paths: Mapping[str, str],
        on_list: OnList,
        on_event: OnEvent,
        *,
        thread_name: str = "watch",
        watch_seconds: int = 30,
        pause: float = 0.5,
    ) -> None:
        self.api = api
        self.paths = dict(paths)
        self.on_list = on_list
        self.on_event = on_event
        self.thread_name = thread_name
        self.watch_seconds = watch_seconds
        self.pause = pause
        self.lists = 0
        self.list_seconds = 0.0
        self.events = 0
        self.restarts = 0
        self.errors: list[str] = []
        self._lock = threading.Condition()
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> ListWatch:
        for name in self.paths:
            thread = threading.Thread(
                target=self._run, args=(name,), name=f"{self.thread_name}-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def wait_listed(self, timeout: float) -> bool:
        """Whether every collection was listed (and so is watched) within `timeout`."""
        with self._lock:
            return self._lock.wait_for(lambda: self._listed >= set(self.paths), timeout)

    def stop(self, wait: float = 1.0) -> None:
        """End every thread; wait for each at most `wait` seconds (a WATCH ends by itself
        within its timeout, or at its next event)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=wait)

    def _run(self, name: str) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list(name)
                version = self._watch(name, version)
            except Exception as exc:  # noqa: BLE001 - e.g. the API server restarting
                with self._lock:
                    if len(self.errors) < MAX_ERRORS:
                        self.errors.append(f"{name}: {exc}"[:ERROR_CHARS])
                version = ""
                self._stop.wait(self.pause)

    def _list(self, name: str) -> str:
        """LIST the collection, hand its items over; the version to WATCH from."""
        started = time.time()
        listing = self.api.json("GET", self.paths[name])
        answered = time.time()
        with self._lock:
            self.lists += 1
            self.list_seconds += answered - started
        self.on_list(name, listing.get("items") or [], answered)
        with self._lock:
            self._listed.add(name)
            self._lock.notify_all()
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, name: str, version: str) -> str:
        """One WATCH from `version`: the version to go on from ("" to LIST again)."""
        for event in self.api.watch(self.paths[name], version, timeout_seconds=self.watch_seconds):
            if self._stop.is_set():
                return version
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                version = ""  # 410 Gone, or refused: LIST again
                break
            version = version_of(obj) or version
            with self._lock:
                self.events += 1
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.on_event(name, kind, obj)
        with self._lock:
            self.restarts += 1
        return version
