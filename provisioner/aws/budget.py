"""A client-side budget of AWS calls, so that throttling is absorbed before it becomes a condition.

One token bucket per (region, service) of the operator's account, shared by every worker
thread, plus one per documented action group (SQS tagging actions). The buckets start at
the limits AWS documents and adapt to what the cloud says:

- every call takes a token first, waiting for one when the bucket is empty;
- a throttling answer halves the bucket's refill rate (never below 5 % of the documented
  rate), shrinks its size in proportion and empties it (multiplicative decrease), once per
  burst of throttles: answers to calls that took their token before the last decrease were
  paced by the old rate and say nothing new about the new one (without this, the calls in
  flight when a limit is hit would halve the rate once each, down to the floor);
- every call that is not throttled gives back 2 % of the documented rate (additive
  increase), up to the documented rate.

A throttled call is retried inside `run`, after the shrunken budget lets it go again, for as
long as its bucket has been throttled for less than `max_throttled_seconds` without one call
getting through; past that the throttling error is raised and the reconciler reports it.

AWS throttles per account: a resource in a CloudAccount spends that account's buckets (the
key is (account, region, bucket); "" is the operator's own account). Documented limits (the
sources are in docs/api.md):

- RDS: 300 requests in a burst, 12 per second sustained, per account and region
  (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-api-throttling.html);
- SQS: tagging actions (TagQueue, UntagQueue, ListQueueTags) 5 per second per account
  (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html);
  no published limit for the other queue actions, so no bucket for them;
- S3: 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD per second per partitioned prefix
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html): the
  write rate, the lower one, for the whole service;
- Resource Groups Tagging API (the periodic looks' batched tag reads): "Rate of calling the
  GetResources API operation: Maximum of 15 calls per second"
  (https://docs.aws.amazon.com/tag-editor/latest/userguide/reference.html); no burst is
  documented, so one second's worth.

`backlog` says how long calls already wait on a service's buckets: the periodic resync
defers a look rather than have it queue behind them (or creates queue behind it).

A call made for a namespace (`turns.CALLER`, set around a resource's pass) waits its turn
among that namespace's calls, and the namespaces' turns are interleaved: one namespace's
thousand calls do not put another's behind all of them (provisioner/aws/turns.py).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import botocore.exceptions

from provisioner import tracing
from provisioner.aws.codes import SLOW_DOWN
from provisioner.aws.turns import CALLER, HEADROOM, Schedule, Turns

T = TypeVar("T")
tracing.THROTTLE_CODES.update(SLOW_DOWN)


@dataclass(frozen=True)
class Limit:
    """A token bucket's size and refill rate (tokens per second)."""

    burst: float
    rate: float


DEFAULT_LIMITS: dict[str, Limit | None] = {
    "rds": Limit(burst=300, rate=12),
    "sqs.tagging": Limit(burst=5, rate=5),
    "s3": Limit(burst=3500, rate=3500),
    "resourcegroupstaggingapi": Limit(burst=15, rate=15),
}
# Operations that AWS limits as a group of their own: service -> operation -> group.
DEFAULT_GROUPS: dict[str, dict[str, str]] = {
    "sqs": {"TagQueue": "tagging", "UntagQueue": "tagging", "ListQueueTags": "tagging"},
}


class BudgetSpecError(ValueError):
    """A budget specification that does not parse; the message says which part."""


KNOWN_NAMES = frozenset(
    {"rds", "sqs", "s3", "resourcegroupstaggingapi"}
    | {f"{service}.{group}" for service, ops in DEFAULT_GROUPS.items() for group in ops.values()}
)


def parse_limits(spec: str) -> dict[str, Limit | None]:
    """`rds=300:12,sqs.tagging=5:5,s3=off` -> overrides of DEFAULT_LIMITS (None: no bucket)."""
    limits: dict[str, Limit | None] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise BudgetSpecError(f"AWS call budget {part!r}: expected NAME=BURST:RATE or NAME=off")
        if name not in KNOWN_NAMES:
            known = ", ".join(sorted(KNOWN_NAMES))
            raise BudgetSpecError(f"AWS call budget {part!r}: unknown name {name!r} ({known})")
        if value == "off":
            limits[name] = None
            continue
        burst, sep, rate = value.partition(":")
        try:
            parsed = Limit(burst=float(burst), rate=float(rate))
        except ValueError:
            parsed = None
        if not sep or parsed is None or parsed.burst < 1 or parsed.rate <= 0:
            raise BudgetSpecError(
                f"AWS call budget {part!r}: BURST must be >= 1 and RATE > 0 (e.g. rds=300:12)"
            )
        limits[name] = parsed
    return limits


@dataclass(frozen=True)
class BudgetSettings:
    limits: dict[str, Limit | None] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    groups: dict[str, dict[str, str]] = field(default_factory=lambda: dict(DEFAULT_GROUPS))
    # How long a bucket may stay throttled, with no call getting through, before a throttled
    # call fails (and the resource shows Synced=False, ReconcileError).
    max_throttled_seconds: float = 60.0
    decrease: float = 0.5
    recovery: float = 0.02
    floor: float = 0.05

    @classmethod
    def from_spec(cls, spec: str = "", max_throttled_seconds: float = 60.0) -> BudgetSettings:
        if max_throttled_seconds < 0:
            raise BudgetSpecError("AWS call budget: max throttled seconds must be >= 0")
        return cls(
            limits={**DEFAULT_LIMITS, **parse_limits(spec)},
            max_throttled_seconds=max_throttled_seconds,
        )


class Bucket:
    """One adaptive token bucket. Not locked itself: CallBudget holds the lock."""

    def __init__(
        self, name: str, limit: Limit, settings: BudgetSettings, now: float, share: float = 1.0
    ) -> None:
        self.name = name
        self.limit = limit
        self.settings = settings
        # This process's part of the account's limit (1/N of N sharded replicas).
        self.share = share
        self.rate = self.full_rate
        self.capacity = max(1.0, limit.burst * share)
        self.tokens = self.capacity
        self.updated = now
        self.throttled_since: float | None = None
        # When the rate was last decreased.
        self.decreased_at = float("-inf")
        # The moments promised to calls that took a token before it was there.
        self.schedule = Schedule()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def reserve(self, now: float) -> float:
        """Take a token (possibly one not there yet); seconds to wait before using it."""
        self._refill(now)
        self.schedule.prune(now)
        self.tokens -= 1
        wait = 0.0 if self.tokens >= 0 else -self.tokens / self.rate
        if wait > 0:
            self.schedule.promise(now + wait, None)
        return wait

    def reserve_turn(self, now: float, queued: bool) -> float:
        """Take a token for a namespace's call (see provisioner/aws/turns.py): one that no
        promised call needs, at the first moment there is one; with `queued` (more of its
        namespace's calls wait behind it), behind every promised call and leaving HEADROOM
        tokens. Seconds to wait; the caller promises the moment its call goes."""
        self._refill(now)
        self.schedule.prune(now)
        need = 1.0 + (max(0.0, min(HEADROOM, self.capacity - 1.0)) if queued else 0.0)
        wait = self.schedule.fit(self.tokens, now, self.rate, self.capacity, need, tail=queued)
        self.tokens -= 1
        return wait

    def throttled(self, now: float, reserved_at: float | None = None) -> None:
        """A throttling answer to a call that took its token at `reserved_at` (None: now)."""
        self._refill(now)
        if reserved_at is None or reserved_at >= self.decreased_at:
            floor = self.full_rate * self.settings.floor
            self._set_rate(max(floor, self.rate * self.settings.decrease))
            self.tokens = min(self.tokens, 0.0)
            self.decreased_at = now
        if self.throttled_since is None:
            self.throttled_since = now

    def succeeded(self, now: float) -> None:
        self._refill(now)
        self._set_rate(min(self.full_rate, self.rate + self.full_rate * self.settings.recovery))
        self.throttled_since = None

    def _set_rate(self, rate: float) -> None:
        """A new refill rate, its size in proportion; tokens already promised keep their times.

        Negative tokens are calls already waiting, each for its moment at the old rate: the
        debt is rescaled so that it is paid off at the same moment at the new rate. Otherwise
        a rate raised while calls wait would let the next call go before them, alongside them.
        """
        if self.tokens < 0:
            self.tokens *= rate / self.rate
        self.rate = rate
        self._resize()

    @property
    def full_rate(self) -> float:
        """The documented rate, this process's share of it."""
        return self.limit.rate * self.share

    def set_share(self, now: float, share: float) -> None:
        """A new share of the account's limit: the rate (adapted or not) in proportion."""
        self._refill(now)
        rate = self.rate * share / self.share
        self.share = share
        self._set_rate(rate)

    def _resize(self) -> None:
        self.capacity = max(1.0, self.limit.burst * self.share * self.rate / self.full_rate)
        self.tokens = min(self.tokens, self.capacity)

    def throttled_for(self, now: float) -> float:
        return 0.0 if self.throttled_since is None else now - self.throttled_since


class BudgetListeners:
    """Who hears of waits and throttles (the Prometheus metrics register here)."""

    def __init__(self) -> None:
        self.on_wait: list[Callable[[str, float], None]] = []
        self.on_throttle: list[Callable[[str], None]] = []

    def waited(self, service: str, seconds: float) -> None:
        for listener in self.on_wait:
            listener(service, seconds)

    def throttle(self, service: str) -> None:
        for listener in self.on_throttle:
            listener(service)


LISTENERS = BudgetListeners()
# Every live budget, for the tokens gauge.
ACTIVE: weakref.WeakSet[CallBudget] = weakref.WeakSet()


def _throttle_code(exc: BaseException) -> str | None:
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return code if code in SLOW_DOWN else None
    return None


def _client_of(fn: Callable[..., Any]) -> tuple[str, str, str, str] | None:
    """(service, region, operation, account) of a bound boto3 client method, else None."""
    client = getattr(fn, "__self__", None)
    meta = getattr(client, "meta", None)
    service_model = getattr(meta, "service_model", None)
    if meta is None or service_model is None:
        return None
    operation = meta.method_to_api_mapping.get(getattr(fn, "__name__", ""), "")
    account = str(getattr(client, "_provisioner_account", "") or "")
    return service_model.service_name, str(meta.region_name), operation, account


class CallBudget:
    """The operator's AWS call budget; `run` is what Aws.call wraps every call in."""

    def __init__(
        self,
        settings: BudgetSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or BudgetSettings()
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        self._turns = Turns()
        self.share = 1.0
        ACTIVE.add(self)

    def set_share(self, share: float) -> None:
        """Spend only `share` of every documented limit: AWS's limits are per account, and
        N sharded replicas calling one account each keep to 1/N of them."""
        share = min(1.0, max(0.01, share))
        with self._lock:
            if share == self.share:
                return
            self.share = share
            now = self.clock()
            for bucket in self._buckets.values():
                bucket.set_share(now, share)

    def buckets_for(
        self, service: str, region: str, operation: str, account: str = ""
    ) -> list[Bucket]:
        """The buckets a call takes tokens from: its service's, then its group's."""
        names = [service]
        group = self.settings.groups.get(service, {}).get(operation)
        if group:
            names.append(f"{service}.{group}")
        found = []
        with self._lock:
            for name in names:
                limit = self.settings.limits.get(name)
                if limit is None:
                    continue
                bucket = self._buckets.get((account, region, name))
                if bucket is None:
                    bucket = Bucket(name, limit, self.settings, self.clock(), self.share)
                    self._buckets[(account, region, name)] = bucket
                found.append(bucket)
        return found

    def acquire(self, service: str, buckets: list[Bucket]) -> float:
        """Take a token from each bucket, waiting as long as the emptiest one needs (made for
        a namespace: in its turn)."""
        caller = CALLER.get()
        if caller is not None:
            waited = self._turns.take(buckets, caller, self._lock, self.clock, self.sleep)
            if waited > 0:
                LISTENERS.waited(service, waited)
                tracing.budget_waited(waited)
            return waited
        with self._lock:
            now = self.clock()
            wait = max((bucket.reserve(now) for bucket in buckets), default=0.0)
        if wait > 0:
            LISTENERS.waited(service, wait)
            tracing.budget_waited(wait)
            self.sleep(wait)
        return wait

    def backlog(self, service: str, region: str, account: str = "") -> float:
        """Seconds until the calls already waiting on any of `service`'s buckets in that
        account and region (its own and its groups', e.g. `sqs.tagging`) have gone; 0 when
        none waits. Takes no token."""
        wait = 0.0
        with self._lock:
            now = self.clock()
            for (owner, where, name), bucket in self._buckets.items():
                if owner != account or where != region:
                    continue
                if name != service and not name.startswith(f"{service}."):
                    continue
                bucket._refill(now)
                bucket.schedule.prune(now)
                # The last promised call, then those still waiting for their turn.
                last = bucket.schedule.slots[-1][0] - now if bucket.schedule.slots else 0.0
                owed = max(0.0, -bucket.tokens / bucket.rate, last)
                queued = self._turns.queued(bucket)
                if owed > 0 or queued:
                    wait = max(wait, owed + queued / bucket.rate)
        return wait

    def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call `fn` within the budget; absorb throttling as long as the settings allow."""
        called = _client_of(fn)
        if called is None:
            return fn(*args, **kwargs)
        service, region, operation, account = called
        buckets = self.buckets_for(service, region, operation, account)
        if not buckets:
            return fn(*args, **kwargs)
        while True:
            reserved_at = self.clock()
            self.acquire(service, buckets)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if _throttle_code(exc) is None:
                    if isinstance(exc, botocore.exceptions.ClientError):
                        self._succeeded(buckets)  # the cloud answered: not a throttle
                    raise
                tracing.attempt_failed(str(_throttle_code(exc)))
                if not self.throttled(service, buckets, reserved_at):
                    raise
                continue
            self._succeeded(buckets)
            return result

    def throttled(
        self, service: str, buckets: list[Bucket], reserved_at: float | None = None
    ) -> bool:
        """Shrink the bucket the throttle is blamed on; whether to try the call again."""
        blamed = buckets[-1]  # a group's own limit is the narrower one
        LISTENERS.throttle(service)
        with self._lock:
            now = self.clock()
            blamed.throttled(now, reserved_at)
            return blamed.throttled_for(now) <= self.settings.max_throttled_seconds

    def _succeeded(self, buckets: list[Bucket]) -> None:
        with self._lock:
            now = self.clock()
            for bucket in buckets:
                bucket.succeeded(now)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each bucket's state now: region, name, tokens, rate, capacity."""
        with self._lock:
            now = self.clock()
            rows = []
            for (account, region, name), bucket in sorted(self._buckets.items()):
                bucket._refill(now)
                rows.append(
                    {
                        "account": account,
                        "region": region,
                        "bucket": name,
                        "tokens": bucket.tokens,
                        "rate": bucket.rate,
                        "capacity": bucket.capacity,
                    }
                )
            return rows
