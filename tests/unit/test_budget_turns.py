"""The call budget's turns between namespaces (provisioner/aws/turns.py): a namespace's
single call goes ahead of another's flood, namespaces that wait take turns, a namespace's own
calls go first come first served, and the moments promised never go faster than the bucket.

Threads and the real clock where turns are taken between threads (20 to 50 calls a second:
each test takes a few seconds), with bounds that hold when threads wake late on a loaded
machine; the fake clock of test_budget.py for the schedule itself.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

from provisioner.aws.budget import BudgetSettings, CallBudget, Limit
from provisioner.aws.turns import CALLER
from tests.unit.test_budget import FakeClient, FakeTime, budget_with, rds_bucket


class TimedClient(FakeClient):
    """Records (monotonic time, namespace, thread name) of every call it answers."""

    def __init__(self, service: str) -> None:
        super().__init__(service)
        self.lock = threading.Lock()
        self.log: list[tuple[float, str, str]] = []

    def describe_db_instances(self):
        with self.lock:
            self.log.append((time.monotonic(), CALLER.get() or "", threading.current_thread().name))
        return "ok"


def calls_in(
    budget: CallBudget, client: TimedClient, namespace: str | None, n: int, name: str = ""
) -> threading.Thread:
    """A thread making `n` calls, one after the other, for `namespace`."""

    def run():
        CALLER.set(namespace)
        for _ in range(n):
            budget.run(client.describe_db_instances)

    thread = threading.Thread(target=run, daemon=True, name=name or None)
    thread.start()
    return thread


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_a_namespace_s_single_call_goes_ahead_of_another_namespace_s_flood():
    budget = CallBudget(BudgetSettings(limits={"rds": Limit(burst=2, rate=20)}))
    client = TimedClient("rds")
    flood = [calls_in(budget, client, "flood", 6) for _ in range(8)]  # 48 calls: 2.3 s
    wait_until(lambda: len(client.log) >= 10)
    token = CALLER.set("team-b")
    try:
        started = time.monotonic()
        budget.run(client.describe_db_instances)
        waited = time.monotonic() - started
    finally:
        CALLER.reset(token)
    for thread in flood:
        thread.join(timeout=30)
    namespaces = [ns for _, ns, _ in client.log]
    assert len(namespaces) == 49
    # First come, first served it would have gone after every call then waiting (up to 38,
    # about 1.9 s); it found one of the tokens the flood leaves and went at once.
    assert namespaces.index("team-b") <= 20, namespaces
    assert waited < 1.0


def test_namespaces_that_wait_take_turns_whatever_their_number_of_calls():
    budget = CallBudget(BudgetSettings(limits={"rds": Limit(burst=1, rate=20)}))
    client = TimedClient("rds")
    flood = [calls_in(budget, client, "a", 10) for _ in range(6)]  # 60 calls: 3 s
    wait_until(lambda: len(client.log) >= 3)
    single = calls_in(budget, client, "b", 10)  # one call after the other
    for thread in [*flood, single]:
        thread.join(timeout=30)
    order = [ns for _, ns, _ in client.log]
    assert len(order) == 70
    first, last = order.index("b"), len(order) - 1 - order[::-1].index("b")
    # b's calls alternate with a's (or go ahead of them): about 10 of a's between b's first
    # and last. First come, first served, each of b's would wait behind the 5 or 6 calls of
    # a's 6 threads already promised a moment: some 50.
    assert order[first:last].count("a") <= 25, order


def test_a_namespace_s_calls_go_first_come_first_served():
    budget = CallBudget(BudgetSettings(limits={"rds": Limit(burst=1, rate=50)}))
    client = TimedClient("rds")

    def placed() -> int:  # calls made, or waiting for their turn
        with budget._lock:
            queued = sum(len(q) for q in budget._turns.queues.values())
        return len(client.log) + queued

    threads = []
    for i in range(8):
        threads.append(calls_in(budget, client, "ns", 1, name=f"t{i}"))
        wait_until(lambda i=i: placed() >= i + 1)
    for thread in threads:
        thread.join(timeout=30)
    assert [name for _, _, name in client.log] == [f"t{i}" for i in range(8)]


def test_a_flood_keeps_its_rate_and_leaves_headroom_for_others():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=5, rate=5))
    bucket = rds_bucket(budget)
    # 100 calls of a namespace whose calls queue, each promised its moment at once.
    moments = []
    for _ in range(100):
        wait = bucket.reserve_turn(t.now, queued=True)
        if wait > 0:
            bucket.schedule.promise(t.now + wait, "flood")
        moments.append(wait)
    # Three went from the full bucket, the rest a token apart: the documented rate, minus
    # the two tokens kept for others.
    assert moments[:3] == [0.0, 0.0, 0.0]
    assert moments[3:] == pytest.approx([k / 5 for k in range(1, 98)])
    # Another namespace's single call takes one of those at once, then a second; a third
    # finds none left before the flood's last promised moment and goes after it.
    assert bucket.reserve_turn(t.now, queued=False) == 0.0
    assert bucket.reserve_turn(t.now, queued=False) == 0.0
    assert bucket.reserve_turn(t.now, queued=False) == pytest.approx(98 / 5)
    # A call without a namespace is served first come, first served: after all of them.
    assert bucket.reserve(t.now) == pytest.approx(99 / 5)


def test_whatever_the_mix_of_calls_the_moments_keep_to_the_bucket():
    """Namespaces' calls whose calls queue (behind every promised one, leaving headroom),
    single calls (the first spare token) and calls of no namespace (first come, first
    served), at random moments: every window of promised moments holds at most the bucket's
    size plus its refill over the window."""
    rng = random.Random(7)
    limit = Limit(burst=3, rate=4)
    t = FakeTime()
    bucket = rds_bucket(budget_with(t, rds=limit))
    start = t.now
    moments = []
    for _ in range(400):
        t.now += rng.choice([0.0, 0.0, 0.01, 0.1, 0.3, 1.0])
        kind = rng.choice(["queued", "single", "none"])
        if kind == "none":
            wait = bucket.reserve(t.now)
        else:
            wait = bucket.reserve_turn(t.now, queued=kind == "queued")
            if wait > 0:
                bucket.schedule.promise(t.now + wait, kind)
        moments.append(t.now + wait)
    moments.sort()
    for i, first in enumerate(moments):
        for j in range(i, min(len(moments), i + 40)):
            allowed = limit.burst + limit.rate * (moments[j] - first) + 1e-6
            assert j - i + 1 <= allowed, (i, j, moments[i : j + 1])
    # Busy enough to have had to wait: most of the 400 went at the bucket's pace.
    assert moments[-1] - start > 300 / limit.rate


def test_a_single_call_never_takes_a_token_promised_to_a_waiting_call():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=1, rate=1))
    bucket = rds_bucket(budget)
    assert bucket.reserve(t.now) == 0.0  # the bucket's only token
    assert bucket.reserve(t.now) == pytest.approx(1.0)  # promised the next one, at +1 s
    # Nothing is spare before that moment: a namespace's single call goes after it.
    assert bucket.reserve_turn(t.now, queued=False) == pytest.approx(2.0)
    t.now += 1.5  # the promised call has gone; half a token since
    assert bucket.reserve_turn(t.now, queued=False) == pytest.approx(1.5)


def test_the_backlog_counts_the_calls_waiting_for_their_turn():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=1, rate=2))
    bucket = rds_bucket(budget)
    assert budget.backlog("rds", "us-east-1") == 0.0
    bucket.reserve(t.now)
    bucket.reserve(t.now)  # promised at +0.5 s
    assert budget.backlog("rds", "us-east-1") == pytest.approx(0.5)
    key = ("ns", (bucket,))
    budget._turns.queues[key] = collections.deque([object(), object()])
    assert budget.backlog("rds", "us-east-1") == pytest.approx(0.5 + 2 / 2)
