"""Fair turns at the call budget's buckets between the namespaces the calls are made for.

The budget (provisioner/aws/budget.py) hands out tokens before they are there: a call that
finds its bucket empty is promised a moment in the future and sleeps until then. First come,
first served, one namespace with a thousand resources would have every other namespace's
call promised a moment behind all of its own. Instead, for a call made for a namespace
(`CALLER`, set around a resource's pass):

- a namespace has at most `PER_CALLER` calls promised a moment in a bucket at once; its
  other calls wait their turn behind them, first come first served, and are promised one
  when it comes. The promised moments of the namespaces that wait are therefore
  interleaved (each gets the next free moment in turn), whatever their number of calls;
- a call whose namespace has no other call waiting for that bucket goes at the first moment
  at which the bucket holds a token that no promised call needs (`Schedule.fit`), ahead of
  the promised ones when there is such a token; and the calls of a namespace whose calls
  wait behind each other are promised moments that leave `HEADROOM` tokens in the bucket.
  So while one namespace uses all of a bucket's rate, another namespace's occasional call
  finds a token at once, and the first namespace's calls go that much later.

No call ever goes before a token is there for it: every moment is promised against the
bucket's refill, the same rate and size as a call without a namespace (the periodic looks'
batched reads) sees; those keep first come, first served.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Protocol

# The namespace the calls of the current pass are made for; None: no namespace's.
CALLER: ContextVar[str | None] = ContextVar("provisioner_budget_caller", default=None)
# Calls of one namespace promised a moment in one bucket at once.
PER_CALLER = 1
# Tokens the promised moments of a namespace whose calls queue leave in the bucket, for a
# namespace with a single call (at most the bucket's size less one).
HEADROOM = 2.0
# The shortest sleep of a call waiting for its turn (seconds): it looks again after it.
MIN_PAUSE = 0.001
# Tokens counted as there though a rounding error short (the levels add up many refills).
EPSILON = 1e-6


class Schedule:
    """The moments promised to calls of one bucket that took a token before it was there."""

    def __init__(self) -> None:
        self.slots: list[tuple[float, str | None]] = []

    def prune(self, now: float) -> None:
        """Forget the moments that have come: those calls have gone (their tokens spent)."""
        if self.slots and self.slots[0][0] <= now:
            del self.slots[: bisect.bisect_right(self.slots, now, key=_time)]

    def promise(self, at: float, caller: str | None) -> None:
        bisect.insort(self.slots, (at, caller), key=_time)

    def held_by(self, caller: str) -> list[float]:
        """The moments promised to `caller`'s calls, earliest first."""
        return [at for at, who in self.slots if who == caller]

    def fit(
        self, tokens: float, now: float, rate: float, capacity: float, need: float, tail: bool
    ) -> float:
        """Seconds from `now` until one more call may go: the bucket then holds `need` tokens
        that no promised call takes, and every call promised a later moment still finds its
        own. `tokens`: the bucket's count less the promised calls (negative: owed). With
        `tail`, not before the last promised moment (behind every promised call)."""
        level = tokens + len(self.slots)
        starts = [(now, level)]  # each gap between promised moments: its start and level there
        for when, _ in self.slots:
            level = min(capacity, level + (when - starts[-1][0]) * rate) - 1
            starts.append((when, level))
        ends = [when for when, _ in self.slots] + [math.inf]
        # The lowest level just after a promised call from each gap on: one more call now
        # leaves every later promised call its token while that is at least 1.
        lowest = [math.inf] * len(starts)
        for j in range(len(starts) - 2, -1, -1):
            lowest[j] = min(starts[j + 1][1], lowest[j + 1])
        for j in range(len(starts) - 1 if tail else 0, len(starts)):
            start, level = starts[j]
            go = start + max(0.0, need - level) / rate
            if lowest[j] >= 1 - EPSILON and go <= ends[j]:
                return max(0.0, go - now)
        raise AssertionError("the gap after the last promised call always fits")


def _time(slot: tuple[float, str | None]) -> float:
    return slot[0]


class TurnBucket(Protocol):
    """What Turns needs of a bucket (provisioner.aws.budget.Bucket)."""

    schedule: Schedule
    rate: float

    def reserve_turn(self, now: float, queued: bool) -> float: ...


Key = tuple[str, tuple[TurnBucket, ...]]


class Turns:
    """Each namespace's calls waiting for their turn at a set of buckets, first come first."""

    def __init__(self) -> None:
        self.queues: dict[Key, deque[object]] = {}

    def take(
        self,
        buckets: Sequence[TurnBucket],
        caller: str,
        lock: threading.Lock,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> float:
        """Wait for the call's turn, then for its token; returns the seconds waited."""
        key = (caller, tuple(buckets))
        with lock:
            ticket = object()
            self.queues.setdefault(key, deque()).append(ticket)
        waited = wait = 0.0
        try:
            while True:
                with lock:
                    now = clock()
                    pause = self._pause(key, ticket, now)
                    if pause is None:
                        queued = self._leave(key, ticket) > 0
                        wait = max(b.reserve_turn(now, queued) for b in buckets)
                        if wait > 0:
                            for bucket in buckets:
                                bucket.schedule.promise(now + wait, caller)
                        break
                sleep(pause)
                waited += pause
        finally:
            with lock:
                self._leave(key, ticket)
        if wait > 0:
            sleep(wait)
        return waited + wait

    def _pause(self, key: Key, ticket: object, now: float) -> float | None:
        """None: the call's turn has come; else seconds to sleep before looking again."""
        caller, buckets = key
        ahead = self.queues[key].index(ticket)
        promised = []
        for bucket in buckets:
            bucket.schedule.prune(now)
            held = bucket.schedule.held_by(caller)
            if len(held) >= PER_CALLER:
                promised.append(held[0])
        if not ahead and not promised:
            return None
        # Its namespace's first promised call goes then; the calls ahead of it in the queue
        # go a token apart at best.
        until = max(promised, default=now) - now
        return max(MIN_PAUSE, until + ahead / min(b.rate for b in buckets))

    def _leave(self, key: Key, ticket: object) -> int:
        """Take `ticket` out of its queue (if still there); the calls left behind it."""
        queue = self.queues.get(key)
        if queue is None:
            return 0
        if ticket in queue:
            queue.remove(ticket)
        if not queue:
            del self.queues[key]
        return len(queue)

    def queued(self, bucket: TurnBucket) -> int:
        """Calls waiting for their turn at `bucket`."""
        return sum(len(q) for (_, buckets), q in self.queues.items() if bucket in buckets)
