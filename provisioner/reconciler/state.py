"""What the reconciler remembers of each resource between its passes: one record per uid,
forgotten in one place (`States.forget`) when the resource is gone.

Nothing here is needed for correctness after a restart: a record is rebuilt by the
resource's next pass (a lost pending password means a new one, set in the cloud first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ResourceState:
    # Held by every pass over the resource: a change handler and a resync never act on
    # it at once.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The master password of a database this process created, until its Secret is written.
    pending_password: str | None = None
    # Its last pass was a resync that failed in a way the next resync retries: its change
    # handlers are done, so nothing but the next resync looks at it again.
    failed_resync: bool = False
    # Fields written recently to a kind whose reads may lag behind writes (SQS): field ->
    # (value written, monotonic time until which the previous value may still show, that
    # previous value).
    recent_writes: dict[str, tuple[Any, float, Any]] | None = None
    # Its change handler is requeued (waiting on the cloud: creating, a name held, a write
    # settling) and looks again itself; a resync in between would only poll once more.
    requeued: bool = False
    # Its current generation was refused for good (InvalidSpec, NameConflict): its resync
    # looks at nothing until the spec changes, so no batch reads it.
    refused_for_generation: bool = False
    # Last seen with the paused annotation: no batch reads it either.
    paused: bool = False
    # What a batched describe said of it: (monotonic time the describe started, answer).
    prefetched: tuple[float, Any] | None = None
    # Monotonic time the last cloud write for it returned (infinity while one runs): an
    # answer fetched before that is stale and never stands in for an observation.
    last_write: float = -1.0
    # (namespace, CloudAccount name: where its last pass placed it or the one it was
    # refused; "" for the operator's own): who to look at again when a CloudAccount or a
    # namespace changes. `refused`: its last pass was refused for it.
    placed: tuple[str, str] | None = None
    refused: bool = False
    # (kind, namespace, spec.className): who to look at again when a ResourceClass changes.
    classed: tuple[str, str, str] | None = None

    @property
    def looks_skipped(self) -> bool:
        """No periodic look reads it now (its own handler looks, or nothing may be read)."""
        return self.requeued or self.refused_for_generation or self.paused


class States:
    """The records of every resource the reconciler has met, by uid."""

    def __init__(self) -> None:
        self._by_uid: dict[str, ResourceState] = {}

    def of(self, uid: str) -> ResourceState:
        """The resource's record, made on first use."""
        state = self._by_uid.get(uid)
        if state is None:
            state = self._by_uid[uid] = ResourceState()
        return state

    def get(self, uid: str) -> ResourceState | None:
        """The record if there is one (a look-up that makes none)."""
        return self._by_uid.get(uid)

    def forget(self, uid: str) -> None:
        """The resource is gone: everything remembered of it goes too."""
        self._by_uid.pop(uid, None)

    def items(self) -> Iterator[tuple[str, ResourceState]]:
        return iter(list(self._by_uid.items()))

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def __len__(self) -> int:
        return len(self._by_uid)
