"""Stage workers: where a pass runs. A change pass is counted and holds the resource's lock;
a periodic look (`LOOKING`) runs its blocking calls on the looks' own threads; a cloud
write marks everything read before it returned as stale."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator

import pytest

from provisioner.aws.turns import CALLER
from provisioner.config import Settings
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import LOOKING, Workers


@pytest.fixture
def workers() -> Iterator[Workers]:
    made = Workers(Settings(workers=2, namespace_max_passes=0), {}, States())
    try:
        yield made
    finally:
        made.executor.shutdown(wait=True)
        made.look_executor.shutdown(wait=True)


async def let_others_run() -> None:
    """One turn of the event loop: every task already scheduled takes its next step (up to
    where it waits) before this returns."""
    loop = asyncio.get_running_loop()
    turn: asyncio.Future[None] = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


def thread_name() -> str:
    return threading.current_thread().name


def test_bounds():
    states = States()
    made = Workers(Settings(workers=0, namespace_max_passes=0), {}, states)
    try:
        assert made.workers == 1  # never less than one
        assert made.states is states
    finally:
        made.executor.shutdown(wait=True)
        made.look_executor.shutdown(wait=True)


def test_change_pass_counts_and_holds_the_lock(workers):
    lock = workers.states.of("a").lock

    async def scenario() -> None:
        assert workers.changes_in_flight == 0 and not lock.locked()
        async with workers.change_pass("a", "team-a"):
            assert workers.changes_in_flight == 1
            assert lock.locked()
        assert workers.changes_in_flight == 0 and not lock.locked()

    asyncio.run(scenario())


def test_a_second_pass_on_the_resource_waits_for_the_first(workers):
    order: list[str] = []

    async def scenario() -> None:
        async def second() -> None:
            async with workers.change_pass("a"):
                order.append("second in")

        async with workers.change_pass("a"):
            order.append("first in")
            task = asyncio.create_task(second())
            await let_others_run()
            # Counted while it waits (the looks give way to it), but not inside.
            assert workers.changes_in_flight == 2
            assert order == ["first in"]
            order.append("first out")
        await task
        assert workers.changes_in_flight == 0

    asyncio.run(scenario())
    assert order == ["first in", "first out", "second in"]


def test_passes_on_other_resources_run_together(workers):
    async def scenario() -> None:
        async with workers.change_pass("a"), workers.change_pass("b"):
            assert workers.changes_in_flight == 2
            assert workers.states.of("a").lock.locked() and workers.states.of("b").lock.locked()
            assert workers.changes_busy  # both slots of two taken

    asyncio.run(scenario())
    assert not workers.changes_busy


def test_a_failed_pass_gives_back_its_count_and_lock(workers):
    async def scenario() -> None:
        with pytest.raises(RuntimeError):
            async with workers.change_pass("a", "team-a"):
                raise RuntimeError("the pass failed")
        assert workers.changes_in_flight == 0
        assert not workers.states.of("a").lock.locked()
        # The slot came back too: two more passes fit at once.
        async with workers.change_pass("b"), workers.change_pass("c"):
            pass

    asyncio.run(scenario())


def test_a_look_on_the_resource_waits_for_its_change_pass(workers):
    order: list[str] = []

    async def scenario() -> None:
        async def look() -> None:
            async with workers.look("a"):
                order.append("look")

        async with workers.change_pass("a"):
            task = asyncio.create_task(look())
            await let_others_run()
            assert order == []
            order.append("change out")
        await task

    asyncio.run(scenario())
    assert order == ["change out", "look"]


def test_looks_and_resync_slots_are_not_counted_as_changes(workers):
    async def scenario() -> None:
        async with workers.look("a"):
            assert workers.states.of("a").lock.locked()
            assert workers.changes_in_flight == 0
        async with workers.resync_slot("b"):
            assert workers.states.of("b").lock.locked()
            assert workers.changes_in_flight == 0

    asyncio.run(scenario())


def test_a_change_pass_calls_as_its_namespace(workers):
    async def scenario() -> None:
        before = CALLER.get()
        async with workers.change_pass("a", "team-a"):
            assert CALLER.get() == "team-a"
            # Its blocking calls run in its context: the call budget sees whose they are.
            assert await workers.in_thread(CALLER.get) == "team-a"
        assert CALLER.get() == before

    asyncio.run(scenario())


def test_in_thread_runs_on_the_cloud_threads(workers):
    async def scenario() -> str:
        return await workers.in_thread(thread_name)

    assert asyncio.run(scenario()).startswith("cloud")


def test_in_thread_inside_looking_runs_on_the_look_threads(workers):
    async def scenario() -> tuple[str, str]:
        token = LOOKING.set(True)
        try:
            inside = await workers.in_thread(thread_name)
        finally:
            LOOKING.reset(token)
        after = await workers.in_thread(thread_name)
        return inside, after

    inside, after = asyncio.run(scenario())
    assert inside.startswith("look")
    assert after.startswith("cloud")


def test_in_thread_passes_arguments_and_raises(workers):
    def add(a: int, b: int = 0) -> int:
        if a < 0:
            raise ValueError("negative")
        return a + b

    async def scenario() -> None:
        assert await workers.in_thread(add, 2, b=3) == 5
        with pytest.raises(ValueError, match="negative"):
            await workers.in_thread(add, -1)

    asyncio.run(scenario())


def test_a_write_marks_its_time_while_it_runs_and_when_it_returns(workers):
    state = workers.states.of("a")
    seen: list[float] = []

    def update(value: int) -> int:
        seen.append(state.last_write)
        return value * 2

    before = time.monotonic()
    assert asyncio.run(workers.write("a", update, 21)) == 42
    assert seen == [math.inf]  # anything read while it runs may predate it
    assert before <= state.last_write <= time.monotonic()


def test_a_failed_write_still_marks_its_time(workers):
    state = workers.states.of("a")

    def update() -> None:
        raise RuntimeError("cloud said no")

    with pytest.raises(RuntimeError):
        asyncio.run(workers.write("a", update))
    assert state.last_write != math.inf
    assert state.last_write <= time.monotonic()
