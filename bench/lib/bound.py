"""The shortest time to all Ready that the aws-like cloud itself allows, from the proxy's stats.

Two limits hold whatever the operator does:

- rate: a throttling bucket of size B refilled at R per second lets N calls through in no less
  than (N - B) / R seconds. N is what the run made: the calls the busiest bucket of each kind
  (per account and region, S3 per bucket too) let through between the first create and all
  Ready. The largest over the buckets is the rate bound.
- slow states: an RDS instance is not usable before its `creating` state ends, so the run takes
  at least the longest `creating` drawn (Ready comes with `backing-up`, which is usable).

The bound is the larger of the two (each is a lower bound; their sum is not).

It takes every CR as there from the start. When the creates themselves take a while (on a busy
machine the API server takes 1,000 POSTs in over a minute), the cloud cannot start on a CR
before it exists, which gives a second, tighter lower bound ("paced by the creates"): for a
bucket whose calls come from the n CRs of one kind, created at a_1 <= ... <= a_n, making
C calls in all (C/n each, on average), no schedule ends before
max_k a_k + ((n - k + 1) C/n - B) / R, because at a_k the bucket holds at most B tokens; and
no RDS instance is usable before the last one's create plus the shortest `creating` drawn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

# Drawn durations that keep a resource from being Ready (in the profile's names).
NOT_READY_STATES = ("rds.create",)


def by_service(counts: dict[str, int]) -> dict[str, int]:
    """`{"rds.DescribeDBInstances": 3, ...}` -> `{"rds": 3, ...}`."""
    found: Counter[str] = Counter()
    for label, n in counts.items():
        found[label.split(".", 1)[0]] += n
    return dict(sorted(found.items()))


def paced(arrivals: Sequence[float], calls: float, burst: float, rate: float) -> float:
    """max_k a_k + ((n - k + 1) calls/n - burst) / rate over the sorted arrivals."""
    times = sorted(arrivals)
    n = len(times)
    if n == 0:
        return max(0.0, calls - burst) / rate
    return max(times[k] + max(0.0, (n - k) * calls / n - burst) / rate for k in range(n))


def cloud_bound(
    stats: dict[str, Any],
    all_ready_s: float | None,
    arrivals: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """The bounds, what binds, and the run's time to all Ready against them.

    `arrivals`: per AWS service, when each CR of its kind was created (seconds from the
    first create); with them, the bounds paced by the creates too.
    """
    arrivals = arrivals or {}
    buckets = bucket_bounds(stats.get("buckets") or {}, arrivals)
    binding = max(buckets, key=lambda b: buckets[b]["bound_s"], default=None)
    rate_s = buckets[binding]["bound_s"] if binding else 0.0
    paced_binding = max(buckets, key=lambda b: buckets[b]["paced_bound_s"], default=None)
    paced_rate_s = buckets[paced_binding]["paced_bound_s"] if paced_binding else 0.0
    drawn = stats.get("durations_drawn") or {}
    slow_name, slow_s, paced_slow_s = slow_bounds(drawn, arrivals)
    bound_s = max(rate_s, slow_s)
    paced_s = max(paced_rate_s, paced_slow_s)
    ratio = all_ready_s / bound_s if all_ready_s is not None and bound_s > 0 else None
    paced_ratio = all_ready_s / paced_s if all_ready_s is not None and paced_s > 0 else None
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
        "paced_rate_bound_s": round(paced_rate_s, 2),
        "paced_rate_binding": paced_binding,
        "paced_slow_bound_s": round(paced_slow_s, 2),
        "paced_bound_s": round(paced_s, 2),
        "paced_dominated_by": (
            (paced_binding if paced_rate_s >= paced_slow_s else slow_name) if paced_s > 0 else None
        ),
        "paced_ratio": None if paced_ratio is None else round(paced_ratio, 3),
    }


def bucket_bounds(
    rows: dict[str, Any], arrivals: Mapping[str, Sequence[float]]
) -> dict[str, dict[str, Any]]:
    """Per throttling bucket (the proxy's stats' rows), its rate bound (`bound_s`) and the
    bound paced by the creates (`paced_bound_s`)."""
    buckets: dict[str, dict[str, Any]] = {}
    for name, row in rows.items():
        seconds = max(0.0, row["calls"] - row["burst"]) / row["rate"]
        service = name.split(".", 1)[0]
        # Buckets per S3 bucket: each is used by one CR, so its own calls are what count.
        if row.get("per") == "account" and arrivals.get(service):
            at = paced(arrivals[service], row["calls"], row["burst"], row["rate"])
        else:
            at = seconds
        buckets[name] = {**row, "bound_s": round(seconds, 2), "paced_bound_s": round(at, 2)}
    return buckets


def slow_bounds(
    drawn: dict[str, Any], arrivals: Mapping[str, Sequence[float]]
) -> tuple[str | None, float, float]:
    """The slow state that binds (of the durations drawn), its bound (the longest drawn), and
    the bound paced by the creates (the last RDS create plus the shortest drawn)."""
    slow = {name: drawn[name] for name in NOT_READY_STATES if name in drawn}
    slow_name = max(slow, key=lambda n: slow[n]["max_s"], default=None)
    slow_s = slow[slow_name]["max_s"] if slow_name else 0.0
    last_db = max(arrivals.get("rds") or [0.0])
    paced_slow_s = max(
        [slow_s] + [last_db + slow[n].get("min_s", 0.0) for n in slow if arrivals.get("rds")]
    )
    return slow_name, slow_s, paced_slow_s
