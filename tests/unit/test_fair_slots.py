"""Slots shared between namespaces: turns, first come first served within a namespace, the
per-namespace cap, cancellation; kopf's requests and per-object workers taking turns (a real
aiohttp server, kopf's own worker); and threads that carry the submitter's context."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import kopf
import pytest
from aiohttp import web
from kopf._cogs.structs import references
from kopf._core.reactor import queueing

from provisioner.reconciler.fair_slots import (
    ContextThreadPool,
    FairSlots,
    fair_requests,
    fair_workers,
    namespace_of,
)


async def settle() -> None:
    """Let every task that can run do so (granted waiters record their turn)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Passes:
    """Tasks that each take a slot, record it, and hold it until released one by one."""

    def __init__(self, slots: FairSlots) -> None:
        self.slots = slots
        self.order: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, namespace: str, name: str) -> None:
        self.release[name] = asyncio.Event()

        async def run() -> None:
            async with self.slots.slot(namespace):
                self.order.append(name)
                await self.release[name].wait()

        self.tasks[name] = asyncio.create_task(run())

    async def finish(self, name: str) -> None:
        self.release[name].set()
        await self.tasks[name]
        await settle()


def test_freed_slots_go_to_the_waiting_namespaces_in_turn() -> None:
    async def scenario() -> None:
        slots = FairSlots(2)
        passes = Passes(slots)
        for i in range(6):
            passes.start("flood", f"a{i}")
        await settle()
        for i in range(2):
            passes.start("team-b", f"b{i}")
        passes.start("team-c", "c0")
        await settle()
        assert passes.order == ["a0", "a1"]
        for name in ["a0", "a1", "a2", "b0", "c0", "a3", "b1", "a4"]:
            await passes.finish(name)
        # Each freed slot went to the next namespace in turn, not to the flood's next one.
        assert passes.order == ["a0", "a1", "a2", "b0", "c0", "a3", "b1", "a4", "a5"]
        await passes.finish("a5")
        assert slots.free == 2 and not slots.held and slots.waiting == 0

    asyncio.run(scenario())


def test_a_namespace_is_served_first_come_first_served() -> None:
    async def scenario() -> None:
        slots = FairSlots(1)
        passes = Passes(slots)
        for i in range(5):
            passes.start("ns", f"p{i}")
            await settle()
        for i in range(5):
            await passes.finish(f"p{i}")
        assert passes.order == [f"p{i}" for i in range(5)]

    asyncio.run(scenario())


def test_a_namespace_holds_at_most_its_cap_and_leaves_the_other_slots_free() -> None:
    async def scenario() -> None:
        slots = FairSlots(8, cap=2)
        passes = Passes(slots)
        for i in range(5):
            passes.start("flood", f"a{i}")
        await settle()
        assert passes.order == ["a0", "a1"]  # capped: six slots stay free
        assert slots.free == 6 and slots.held["flood"] == 2 and slots.waiting == 3
        passes.start("team-b", "b0")
        await settle()
        assert passes.order[-1] == "b0"  # at once, not behind the flood
        await passes.finish("a0")
        assert passes.order[-1] == "a2" and slots.held["flood"] == 2
        for name in ["a1", "a2", "a3", "a4", "b0"]:
            await passes.finish(name)
        assert slots.free == 8 and not slots.held

    asyncio.run(scenario())


def test_no_cap_lets_one_namespace_fill_every_slot() -> None:
    async def scenario() -> None:
        slots = FairSlots(3, cap=0)
        passes = Passes(slots)
        for i in range(3):
            passes.start("ns", f"p{i}")
        await settle()
        assert passes.order == ["p0", "p1", "p2"] and slots.free == 0

    asyncio.run(scenario())


def test_the_unknown_namespace_is_not_capped() -> None:
    async def scenario() -> None:
        slots = FairSlots(3, cap=1)
        entered = 0
        async with slots, slots:
            entered += 2
            assert slots.held[""] == 2
        assert entered == 2 and slots.free == 3

    asyncio.run(scenario())


def test_a_cancelled_waiter_frees_nothing_and_is_skipped() -> None:
    async def scenario() -> None:
        slots = FairSlots(1)
        passes = Passes(slots)
        passes.start("a", "a0")
        await settle()
        passes.start("b", "b0")
        passes.start("c", "c0")
        await settle()
        passes.tasks["b0"].cancel()
        await settle()
        assert passes.tasks["b0"].cancelled()
        assert slots.free == 0 and slots.held == {"a": 1} and slots.waiting == 1
        await passes.finish("a0")
        assert passes.order == ["a0", "c0"]
        await passes.finish("c0")
        assert slots.free == 1 and not slots.held and slots.waiting == 0

    asyncio.run(scenario())


def test_a_waiter_cancelled_after_its_turn_came_gives_the_slot_on() -> None:
    async def scenario() -> None:
        slots = FairSlots(1)
        await slots.acquire("a")
        b = asyncio.create_task(slots.acquire("b"))
        c = asyncio.create_task(slots.acquire("c"))
        await settle()
        # "a" gives its slot back: it is handed to "b", cancelled before it could run.
        slots.release("a")
        assert slots.held == {"b": 1}
        b.cancel()
        await settle()
        assert b.cancelled() and c.done()
        assert slots.held == {"c": 1} and slots.free == 0 and slots.waiting == 0
        slots.release("c")
        assert slots.free == 1 and not slots.held

    asyncio.run(scenario())


def test_releasing_a_slot_not_held_is_refused() -> None:
    slots = FairSlots(1)
    with pytest.raises(RuntimeError, match="holds no slot"):
        slots.release("ns")
    assert slots.free == 1


def test_the_thread_pool_runs_calls_in_the_submitters_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def scenario(pool: ContextThreadPool) -> tuple[str, str, str]:
        loop = asyncio.get_running_loop()

        async def one(value: str) -> str:
            var.set(value)
            return await loop.run_in_executor(pool, var.get)

        a, b, unset = await asyncio.gather(one("a"), one("b"), loop.run_in_executor(pool, var.get))
        return a, b, unset

    with ContextThreadPool(max_workers=2) as pool:
        assert asyncio.run(scenario(pool)) == ("a", "b", "unset")


def test_namespace_of_an_api_path() -> None:
    assert namespace_of("/apis/cloud.provisioner.dev/v1beta1/namespaces/team-a/queues/q") == (
        "team-a"
    )
    assert namespace_of("/api/v1/namespaces/team-b/events") == "team-b"
    assert namespace_of("/apis/cloud.provisioner.dev/v1beta1/cloudaccounts/x") == ""
    assert namespace_of("/api/v1/namespaces") == ""


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (letting the loop run) until `predicate` holds; fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_kopf_s_requests_take_turns_by_namespace_and_watches_take_no_slot() -> None:
    """Through a real aiohttp server that answers one request at a time, on its signal."""

    async def scenario() -> list[str]:
        arrived: list[str] = []
        answer = asyncio.Event()

        async def handle(request: web.Request) -> web.Response:
            arrived.append(f"{request.match_info['namespace']}/{request.match_info['name']}")
            if "watch" not in request.query:
                await answer.wait()
                answer.clear()
            return web.Response(text="{}")

        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/configmaps/{name}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}/api/v1/namespaces"
        slots = FairSlots(1)
        async with aiohttp.ClientSession(middlewares=[fair_requests(slots)]) as session:

            async def get(namespace: str, name: str, query: str = "") -> None:
                async with session.get(f"{base}/{namespace}/configmaps/{name}{query}") as resp:
                    await resp.read()

            flood = [asyncio.create_task(get("flood", f"f{i}")) for i in range(4)]
            await until(lambda: len(arrived) == 1 and slots.waiting == 3)
            single = asyncio.create_task(get("team-b", "b0"))
            await until(lambda: slots.waiting == 4)
            await get("flood", "w", "?watch=true")  # not held up by the slot in use
            for answered in range(1, 5):
                answer.set()
                await until(lambda: len(arrived) == answered + 2)  # noqa: B023 - awaited here
            answer.set()
            await asyncio.gather(*flood, single)
        await runner.cleanup()
        return arrived

    # First come, first served, team-b's request would be the last; each namespace in turn,
    # it is the one after the flood's next.
    assert asyncio.run(scenario()) == [
        "flood/f0",
        "flood/w",
        "flood/f1",
        "team-b/b0",
        "flood/f2",
        "flood/f3",
    ]


def kopf_worker_kwargs(
    namespace: str, name: str, group: str, processed: list[str], release: asyncio.Event
) -> dict[str, Any]:
    """What kopf's watcher passes its per-object worker, with one ADDED event queued."""
    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = 0.01
    resource = references.Resource(group, "v1", "things")
    key = (resource, f"uid-{name}")
    stream = queueing.Stream(backlog=asyncio.Queue(), pressure=asyncio.Event())
    meta = {"namespace": namespace, "name": name, "uid": f"uid-{name}"}
    stream.backlog.put_nowait(cast(Any, {"type": "ADDED", "object": {"metadata": meta}}))

    async def processor(**_: Any) -> None:
        processed.append(f"{namespace}/{name}")
        await release.wait()

    return {
        "signaller": asyncio.Condition(),
        "settings": settings,
        "processor": processor,
        "streams": {key: stream},
        "key": key,
    }


def test_kopf_s_workers_of_our_kinds_start_by_namespace_at_most_the_cap() -> None:
    group = "cloud.provisioner.dev"

    async def scenario() -> None:
        processed: list[str] = []
        release = asyncio.Event()
        workers = [
            asyncio.create_task(
                queueing.worker(**kopf_worker_kwargs(ns, name, g, processed, release))
            )
            for ns, name, g in [
                ("flood", "f0", group),
                ("flood", "f1", group),
                ("flood", "f2", group),
                ("team-b", "b0", group),
                ("flood", "other", "example.com"),  # another group's: not gated
            ]
        ]
        await settle()
        # Two slots, one a namespace at most: the flood's first, then team-b's at once.
        assert sorted(processed) == ["flood/f0", "flood/other", "team-b/b0"]
        release.set()
        await asyncio.wait_for(asyncio.gather(*workers), 10)
        assert sorted(processed) == sorted(
            ["flood/f0", "flood/f1", "flood/f2", "team-b/b0", "flood/other"]
        )

    fair_workers(2, 1, group)
    try:
        asyncio.run(scenario())
    finally:
        queueing.worker = queueing.worker.ungated  # type: ignore[attr-defined]


def test_a_kopf_worker_cancelled_while_waiting_for_its_turn_forgets_its_stream() -> None:
    group = "cloud.provisioner.dev"

    async def scenario() -> None:
        processed: list[str] = []
        release = asyncio.Event()
        first = kopf_worker_kwargs("ns", "first", group, processed, release)
        second = kopf_worker_kwargs("ns", "second", group, processed, release)
        running = asyncio.create_task(queueing.worker(**first))
        waiting = asyncio.create_task(queueing.worker(**second))
        await settle()
        assert processed == ["ns/first"]
        waiting.cancel()
        await settle()
        assert waiting.cancelled() and not second["streams"]  # as the worker would leave it
        release.set()
        await asyncio.wait_for(running, 10)

    fair_workers(1, 0, group)
    try:
        asyncio.run(scenario())
    finally:
        queueing.worker = queueing.worker.ungated  # type: ignore[attr-defined]
