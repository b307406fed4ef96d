"""Stage observe: what the cloud says of a resource, with what it may not show yet left out.

A field written within its kind's settle time whose read still shows the previous value is
neither a change to write again nor drift; any other read of it is. A periodic look may use
the answer of a batched describe, once, and never one taken before the last write."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import BatchObserver, BatchTagReader, FieldDiff, Observation
from provisioner.model.resource import Resource
from provisioner.reconciler.observe import PREFETCH_TTL, Observer
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeCloud

VIS = "spec.visibilityTimeoutSeconds"
DELAY = "spec.delaySeconds"
SETTLE = 60.0


class BatchCloud(FakeCloud):
    """A Queue cloud that also describes many at once (`BatchObserver`)."""

    def __init__(self) -> None:
        super().__init__("Queue")
        self.batches: list[tuple[str, list[str], Any]] = []
        self.batch_threads: list[str] = []
        self.batch_failure: Exception | None = None

    def describe_many(
        self, region: str, names: Sequence[str], account: Any = None
    ) -> dict[str, Any]:
        self.batches.append((region, list(names), account))
        self.batch_threads.append(threading.current_thread().name)
        if self.batch_failure is not None:
            raise self.batch_failure
        return {n: {"name": n} for n in names if n in self.objects}

    def observed(self, resource: Resource, described: Any) -> Observation:
        return Observation(exists=True, state="from-batch", arn=described["name"])


class TagCloud(FakeCloud):
    """A Queue cloud whose tags are read in batches (`BatchTagReader`)."""

    def __init__(self) -> None:
        super().__init__("Queue")
        self.tag_batches: list[list[str]] = []
        self.tagged: list[dict[str, str]] = []

    def tags_many(
        self, region: str, names: Sequence[str], account: Any = None
    ) -> dict[str, dict[str, str]]:
        self.tag_batches.append(list(names))
        return {n: dict(self.objects[n].tags) for n in names if n in self.objects}

    def observe_tagged(self, resource: Resource, tags: dict[str, str]) -> Observation:
        self.tagged.append(tags)
        return Observation(exists=True, state="tagged")


def queue(name: str = "q", visibility: int = 60) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {"visibilityTimeoutSeconds": visibility},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


class World:
    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        self.observer = Observer({"Queue": cloud}, self.workers, self.states)

    def observe(self, resource: Resource, resync: bool = False) -> Observation:
        return asyncio.run(self.observer.observe(resource, resync))

    def prefetch(self, *resources: Resource, account: Any = None) -> int:
        due = [(r.uid, r.region, r.external_name, account) for r in resources]
        return asyncio.run(self.observer.prefetch("Queue", due))

    def observes(self) -> int:
        return sum(c.method == "observe" for c in self.cloud.calls)


def make(cloud: FakeCloud) -> Iterator[World]:
    world = World(cloud)
    try:
        yield world
    finally:
        world.workers.executor.shutdown(wait=True)
        world.workers.look_executor.shutdown(wait=True)


@pytest.fixture
def world() -> Iterator[World]:
    yield from make(FakeCloud("Queue"))


@pytest.fixture
def batch() -> Iterator[World]:
    yield from make(BatchCloud())


@pytest.fixture
def tags() -> Iterator[World]:
    yield from make(TagCloud())


def written(world: World, resource: Resource, old: int, new: int, settle: float = SETTLE) -> None:
    """`new` was just written over `old`; the cloud may still show `old`."""
    world.observer.remember_writes(resource, [FieldDiff(VIS, old, new)], settle)


# -- the settle window -------------------------------------------------------------------


def test_the_old_value_within_the_settle_time_is_neither_diff_nor_drift(world):
    r = queue(visibility=60)
    world.cloud.seed(r, fields={VIS: 10})
    written(world, r, 10, 60)
    obs = world.observe(r)
    assert obs.diffs == []
    assert obs.settling == [VIS]
    # Still remembered: the next look within the window says the same.
    obs = world.observe(r)
    assert obs.diffs == [] and obs.settling == [VIS]


def test_other_fields_are_still_diffs(world):
    r = queue(visibility=60)
    world.cloud.seed(r, fields={VIS: 10, DELAY: 7})
    written(world, r, 10, 60)
    obs = world.observe(r)
    assert obs.diffs == [FieldDiff(DELAY, 7, 0)]
    assert obs.settling == [VIS]


def test_a_third_value_in_the_cloud_is_a_diff(world):
    """Written 60 over 10; the cloud now shows 20, which nobody here wrote: that is no lag
    of the write but a change, to be written again (or reported as drift)."""
    r = queue(visibility=60)
    obj = world.cloud.seed(r, fields={VIS: 10})
    written(world, r, 10, 60)
    obj.fields[VIS] = 20
    obs = world.observe(r)
    assert obs.diffs == [FieldDiff(VIS, 20, 60)]
    assert obs.settling == []


def test_a_spec_that_changed_again_is_a_diff(world):
    r = queue(visibility=90)  # the spec now asks for a third value
    world.cloud.seed(r, fields={VIS: 10})
    written(world, r, 10, 60)
    obs = world.observe(r)
    assert obs.diffs == [FieldDiff(VIS, 10, 90)]
    assert obs.settling == []
    assert world.states.of(r.uid).recent_writes is None


def test_the_written_value_showing_ends_the_window(world):
    r = queue(visibility=60)
    obj = world.cloud.seed(r, fields={VIS: 10})
    written(world, r, 10, 60)
    obj.fields[VIS] = 60
    obs = world.observe(r)
    assert obs.diffs == [] and obs.settling == []
    assert world.states.of(r.uid).recent_writes is None
    # Forgotten: the old value showing again later is drift.
    obj.fields[VIS] = 10
    assert world.observe(r).diffs == [FieldDiff(VIS, 10, 60)]


def test_after_the_settle_time_the_old_value_is_a_diff(world):
    r = queue(visibility=60)
    world.cloud.seed(r, fields={VIS: 10})
    world.states.of(r.uid).recent_writes = {VIS: (60, time.monotonic() - 1.0, 10)}
    obs = world.observe(r)
    assert obs.diffs == [FieldDiff(VIS, 10, 60)]
    assert obs.settling == []
    assert world.states.of(r.uid).recent_writes is None


def test_remember_writes(world):
    r = queue()
    state = world.states.of(r.uid)
    world.observer.remember_writes(r, [FieldDiff(VIS, 10, 60)], 0.0)  # a kind with no lag
    world.observer.remember_writes(r, [], SETTLE)
    assert state.recent_writes is None
    before = time.monotonic()
    world.observer.remember_writes(r, [FieldDiff(VIS, 10, 60)], SETTLE)
    world.observer.remember_writes(r, [FieldDiff(DELAY, 7, 0)], SETTLE)
    assert state.recent_writes is not None
    assert set(state.recent_writes) == {VIS, DELAY}  # merged, not replaced
    value, until, previous = state.recent_writes[VIS]
    assert (value, previous) == (60, 10)
    assert before + SETTLE <= until <= time.monotonic() + SETTLE


def test_observe_plainly_leaves_nothing_out(world):
    r = queue(visibility=60)
    world.cloud.seed(r, fields={VIS: 10})
    written(world, r, 10, 60)
    obs = asyncio.run(world.observer.observe_plainly(r))
    assert obs.diffs == [FieldDiff(VIS, 10, 60)]
    assert obs.settling == []
    assert world.states.of(r.uid).recent_writes is not None  # still there for the next pass


def test_nothing_written_is_the_clouds_own_answer(world):
    r = queue(visibility=60)
    world.cloud.seed(r, fields={VIS: 10})
    obs = world.observe(r)
    assert obs.diffs == [FieldDiff(VIS, 10, 60)] and obs.settling == []
    assert world.observes() == 1


# -- the batched describe ------------------------------------------------------------------


def test_a_prefetched_answer_is_used_once(batch):
    r = queue()
    batch.cloud.seed(r)
    assert isinstance(batch.cloud, BatchObserver)
    assert batch.prefetch(r) == 1
    assert batch.observe(r, resync=True).state == "from-batch"
    assert batch.observes() == 0
    # Used up: the next look observes by itself.
    assert batch.observe(r, resync=True).state == "available"
    assert batch.observes() == 1


def test_a_change_pass_never_uses_a_prefetched_answer(batch):
    r = queue()
    batch.cloud.seed(r)
    batch.prefetch(r)
    assert batch.observe(r).state == "available"
    assert batch.observes() == 1


def test_a_prefetched_answer_is_stale_after_a_write(batch):
    r = queue()
    batch.cloud.seed(r)
    batch.prefetch(r)
    asyncio.run(batch.workers.write(r.uid, lambda: None))
    assert batch.observe(r, resync=True).state == "available"
    assert batch.observes() == 1
    assert batch.states.of(r.uid).prefetched is None  # dropped, not kept for later


def test_an_old_prefetched_answer_is_not_used(batch):
    r = queue()
    batch.cloud.seed(r)
    batch.prefetch(r)
    started, described = batch.states.of(r.uid).prefetched
    batch.states.of(r.uid).prefetched = (started - PREFETCH_TTL - 1, described)
    assert batch.observe(r, resync=True).state == "available"


def test_old_answers_are_dropped_by_the_next_prefetch(batch):
    old, new = queue("old"), queue("new")
    batch.cloud.seed(old)
    batch.cloud.seed(new)
    batch.prefetch(old)
    started, described = batch.states.of(old.uid).prefetched
    batch.states.of(old.uid).prefetched = (started - PREFETCH_TTL - 1, described)
    batch.prefetch(new)
    assert batch.states.of(old.uid).prefetched is None
    assert batch.states.of(new.uid).prefetched is not None


def test_prefetch_runs_on_the_look_threads_one_call_per_region_and_account(batch):
    a, b, c = queue("a"), queue("b"), queue("c")
    for r in (a, b, c):
        batch.cloud.seed(r)
    due = [
        (a.uid, "us-east-1", a.external_name, None),
        (b.uid, "us-east-1", b.external_name, None),
        (c.uid, "eu-west-1", c.external_name, "acct"),
    ]
    assert asyncio.run(batch.observer.prefetch("Queue", due)) == 3
    assert batch.cloud.batches == [
        ("us-east-1", [a.external_name, b.external_name], None),
        ("eu-west-1", [c.external_name], "acct"),
    ]
    assert all(name.startswith("look") for name in batch.cloud.batch_threads)


def test_prefetch_skips_resources_no_look_reads(batch):
    a, b, c = queue("a"), queue("b"), queue("c")
    for r in (a, b, c):
        batch.cloud.seed(r)
    batch.states.of(a.uid).paused = True
    batch.states.of(b.uid).refused_for_generation = True
    assert batch.prefetch(a, b, c) == 1
    assert batch.cloud.batches == [("us-east-1", [c.external_name], None)]


def test_a_failed_prefetch_costs_nothing(batch):
    r = queue()
    batch.cloud.seed(r)
    batch.cloud.batch_failure = errors.RetryableError("Throttling", "Throttling")
    assert batch.prefetch(r) == 0
    assert batch.states.of(r.uid).prefetched is None
    assert batch.observe(r, resync=True).state == "available"


def test_a_kind_without_batches_prefetches_nothing(world):
    r = queue()
    world.cloud.seed(r)
    assert world.prefetch(r) == 0
    assert len(world.states) == 0


def test_prefetched_tags_are_used_once(tags):
    r = queue()
    tags.cloud.seed(r)
    assert isinstance(tags.cloud, BatchTagReader)
    assert tags.prefetch(r) == 1
    assert tags.cloud.tag_batches == [[r.external_name]]
    assert tags.observe(r, resync=True).state == "tagged"
    assert tags.cloud.tagged == [r.desired_tags]
    assert tags.observes() == 0
    assert tags.observe(r, resync=True).state == "available"
    assert tags.observes() == 1
