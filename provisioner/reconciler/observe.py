"""Stage: observe. What the cloud says of a resource, with what it may not show yet left out.

A periodic look uses the answer of a batched describe made for the resources whose resync
came due together (`prefetch`), or for a kind whose tags are read in batches, those tags.
A field written within its kind's settle time whose read still shows the previous value is
neither written again nor drift (`Observation.settling` names it).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from provisioner.aws import errors
from provisioner.kinds.contract import (
    BatchObserver,
    BatchTagReader,
    ExternalClient,
    FieldDiff,
    Observation,
)
from provisioner.model.resource import Resource
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import LOOKING, Workers

log = logging.getLogger(__name__)

# How long a batched describe's answer may stand in for a resync pass's own observation.
PREFETCH_TTL = 30.0


class Observer:
    def __init__(self, clients: Mapping[str, ExternalClient], workers: Workers, states: States):
        self.clients = clients
        self.workers = workers
        self.states = states

    async def prefetch(self, kind: str, due: list[tuple[str, str, str, Any]]) -> int:
        """Describe the resources of `kind` whose resync is due, (uid, region, cloud name,
        account), in batches where the kind's cloud allows it, for their passes to use right
        after; returns how many were described. A failed or partial answer costs nothing:
        those passes observe by themselves."""
        client = self.clients.get(kind)
        describe: Callable[..., Mapping[str, Any]]
        if isinstance(client, BatchObserver):
            describe = client.describe_many
        elif isinstance(client, BatchTagReader):
            describe = client.tags_many  # the tags only: each pass reads the rest itself
        else:
            return 0
        self._drop_stale()
        regions: defaultdict[tuple[str, Any], list[tuple[str, str]]] = defaultdict(list)
        for uid, region, name, account in due:
            state = self.states.get(uid)
            if state is not None and state.looks_skipped:  # no look is due, or its own
                continue
            regions[(region, account)].append((uid, name))
        described = 0
        for (region, account), wanted in regions.items():
            started = time.monotonic()
            token = LOOKING.set(True)
            try:
                found = await self.workers.in_thread(
                    describe, region, [n for _, n in wanted], account
                )
            except errors.CloudError as exc:
                log.info("batched describe of %d %s failed: %s", len(wanted), kind, exc)
                continue
            finally:
                LOOKING.reset(token)
            for uid, name in wanted:
                if name in found:
                    self.states.of(uid).prefetched = (started, found[name])
                    described += 1
        return described

    def _drop_stale(self) -> None:
        now = time.monotonic()
        for _, state in self.states.items():
            if state.prefetched is not None and now - state.prefetched[0] > PREFETCH_TTL:
                state.prefetched = None

    def _fresh_prefetched(self, resource: Resource) -> Any | None:
        """The batched answer for a resync pass (used once), if nothing was written since."""
        state = self.states.of(resource.uid)
        fetched, state.prefetched = state.prefetched, None
        if fetched is None:
            return None
        started, described = fetched
        if started <= state.last_write:
            return None
        if time.monotonic() - started > PREFETCH_TTL:
            return None
        return described

    def prefetched(self, client: ExternalClient, resource: Resource) -> Observation | None:
        """The batched describe's answer for a resync pass, if nothing was written since."""
        if not isinstance(client, BatchObserver):
            return None
        described = self._fresh_prefetched(resource)
        return None if described is None else client.observed(resource, described)

    def prefetched_tags(self, client: ExternalClient, resource: Resource) -> dict[str, str] | None:
        """The batched tag read's answer for a resync pass, if nothing was written since."""
        if not isinstance(client, BatchTagReader):
            return None
        tags = self._fresh_prefetched(resource)
        return None if tags is None else dict(tags)

    async def observe(self, resource: Resource, resync: bool = False) -> Observation:
        """Observe, leaving out what the cloud may not show yet. A field the cloud shows as
        written, or shows with a third value, or whose settle time is over, is forgotten."""
        client = self.clients[resource.kind]
        obs = self.prefetched(client, resource) if resync else None
        tags = self.prefetched_tags(client, resource) if resync and obs is None else None
        if obs is None and tags is not None and isinstance(client, BatchTagReader):
            obs = await self.workers.in_thread(client.observe_tagged, resource, tags)
        if obs is None:
            obs = await self.workers.in_thread(client.observe, resource)
        state = self.states.of(resource.uid)
        written, state.recent_writes = state.recent_writes, None
        if not written:
            return obs
        now = time.monotonic()
        settling = [d for d in obs.diffs if _settling(d, written.get(d.field), now)]
        if settling:
            state.recent_writes = {d.field: written[d.field] for d in settling}
            obs.diffs = [d for d in obs.diffs if d not in settling]
            obs.settling = [d.field for d in settling]
        return obs

    async def observe_plainly(self, resource: Resource) -> Observation:
        """The cloud's own answer, nothing left out (a plan, a deletion)."""
        return await self.workers.in_thread(self.clients[resource.kind].observe, resource)

    def remember_writes(self, resource: Resource, written: list[FieldDiff], settle: float) -> None:
        """Fields just written to a kind whose reads may lag by up to `settle` seconds."""
        if settle <= 0 or not written:
            return
        until = time.monotonic() + settle
        state = self.states.of(resource.uid)
        state.recent_writes = {
            **(state.recent_writes or {}),
            **{d.field: (d.desired, until, d.observed) for d in written},
        }


def _settling(diff: FieldDiff, written: tuple[Any, float, Any] | None, now: float) -> bool:
    """The cloud still shows the value it had before our write of `diff`'s field, within
    that write's settle time (a third value is someone else's: a diff as any other)."""
    if written is None:
        return False
    value, until, previous = written
    return until > now and diff.desired == value and diff.observed == previous
