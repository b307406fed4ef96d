"""The aws-like proxy's throttling: token buckets per account, region, service and action.

Each service's buckets (sizes, rates, which actions share one) come from the profile; S3's are
kept per S3 bucket too. A call its bucket refuses is answered with AWS's own code and status
for the service.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from provisioner_dev.cloudprofile import BucketSpec, Profile


class TokenBucket:
    def __init__(self, spec: BucketSpec, now: float) -> None:
        self.spec = spec
        self.tokens = spec.burst
        self.updated = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.spec.burst, self.tokens + (now - self.updated) * self.spec.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Throttler:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.buckets: dict[tuple[str, ...], TokenBucket] = {}
        # Per bucket (same key): calls it let through, calls it refused (since the last reset).
        self.passed: Counter[tuple[str, ...]] = Counter()
        self.refused: Counter[tuple[str, ...]] = Counter()

    def allow(self, account: str, region: str, service: str, action: str, scope: str) -> bool:
        throttling = self.profile.throttling.get(service)
        if throttling is None:
            return True
        found = throttling.bucket_for(action)
        if found is None:
            return True
        name, spec = found
        key = (account, region, service, scope if throttling.per == "bucket" else "", name)
        now = time.monotonic()
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(spec, now)
        allowed = bucket.take(now)
        (self.passed if allowed else self.refused)[key] += 1
        return allowed

    def by_bucket(self) -> dict[str, dict[str, Any]]:
        """`service.bucket` -> its size and rate, how many buckets of it were used (one per
        account and region; S3: per S3 bucket too), and the calls the busiest one let
        through (`calls`): the figure that bounds how fast those calls can be made,
        (calls - burst) / rate seconds at the least."""
        found: dict[str, dict[str, Any]] = {}
        for key in set(self.passed) | set(self.refused):
            service, name = key[2], key[4]
            spec = self.buckets[key].spec
            row = found.setdefault(
                f"{service}.{name}",
                {
                    "burst": spec.burst,
                    "rate": spec.rate,
                    "per": self.profile.throttling[service].per,
                    "instances": 0,
                    "calls": 0,
                    "calls_total": 0,
                    "throttled": 0,
                },
            )
            row["instances"] += 1
            row["calls"] = max(row["calls"], self.passed[key])
            row["calls_total"] += self.passed[key]
            row["throttled"] += self.refused[key]
        return dict(sorted(found.items()))

    def reset(self) -> None:
        self.passed.clear()
        self.refused.clear()
