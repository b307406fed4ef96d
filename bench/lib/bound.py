"""The shortest time to all Ready that the aws-like cloud itself allows, from the proxy's stats.

Two limits hold whatever the operator does:

- rate: a throttling bucket of size B refilled at R per second lets N calls through in no less
  than (N - B) / R seconds. N is what the run made: the calls the busiest bucket of each kind
  (per account and region, S3 per bucket too) let through between the first create and all
  Ready. The largest over the buckets is the rate bound.
- slow states: an RDS instance is not usable before its `creating` state ends, so the run takes
  at least the longest `creating` drawn (Ready comes with `backing-up`, which is usable).

The bound is the larger of the two (each is a lower bound; their sum is not).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# Drawn durations that keep a resource from being Ready (in the profile's names).
NOT_READY_STATES = ("rds.create",)


def by_service(counts: dict[str, int]) -> dict[str, int]:
    """`{"rds.DescribeDBInstances": 3, ...}` -> `{"rds": 3, ...}`."""
    found: Counter[str] = Counter()
    for label, n in counts.items():
        found[label.split(".", 1)[0]] += n
    return dict(sorted(found.items()))


def cloud_bound(stats: dict[str, Any], all_ready_s: float | None) -> dict[str, Any]:
    """The bounds, what binds, and the run's time to all Ready against them."""
    buckets: dict[str, Any] = {}
    for name, row in (stats.get("buckets") or {}).items():
        seconds = max(0.0, row["calls"] - row["burst"]) / row["rate"]
        buckets[name] = {**row, "bound_s": round(seconds, 2)}
    binding = max(buckets, key=lambda b: buckets[b]["bound_s"], default=None)
    rate_s = buckets[binding]["bound_s"] if binding else 0.0
    drawn = stats.get("durations_drawn") or {}
    slow = {name: drawn[name] for name in NOT_READY_STATES if name in drawn}
    slow_name = max(slow, key=lambda n: slow[n]["max_s"], default=None)
    slow_s = slow[slow_name]["max_s"] if slow_name else 0.0
    bound_s = max(rate_s, slow_s)
    ratio = all_ready_s / bound_s if all_ready_s is not None and bound_s > 0 else None
    return {
        "calls_by_service": by_service(stats.get("calls_by_action") or {}),
        "throttled_by_service": by_service(stats.get("throttles_by_action") or {}),
        "refused_by_action": stats.get("refusals_by_action") or {},
        "calls_total": stats.get("calls", 0),
        "throttled_total": stats.get("throttles", 0),
        "buckets": buckets,
        "rate_bound_s": round(rate_s, 2),
        "rate_binding": binding,
        "slow_bound_s": round(slow_s, 2),
        "slow_binding": slow_name,
        "durations_drawn": drawn,
        "bound_s": round(bound_s, 2),
        "dominated_by": (binding if rate_s >= slow_s else slow_name) if bound_s > 0 else None,
        "all_ready_s": all_ready_s,
        "ratio": None if ratio is None else round(ratio, 3),
    }
