"""bench/converge.py's table and summary, from figures alone (the run is tested end to end
by tests/e2e/test_bench_smoke.py)."""

from __future__ import annotations

import dataclasses

from bench.lib.bound import cloud_bound, paced
from bench.lib.options import Options
from bench.lib.report import ROWS, figures, summary, table
from bench.lib.synced import classify
from bench.lib.workload import KINDS, split_mix

OPTS = Options(
    n=12,
    mix="1:1:1:1",
    namespaces=3,
    idle=2,
    restart=30,
    changes=3,
    timeout=120,
    keep=False,
    operator_args=["--workers=8"],
    json_path=None,
    create_method="api",
    create_workers=16,
    change_workers=4,
    seed=1,
    py_spy=None,
    py_spy_rate=100,
    py_spy_mode="cpu",
    workdir=None,
)
RESULTS = {
    "create": {"method": "api", "workers": 16, "create_seconds": 0.4567},
    "ready": {"all_ready_seconds": 71.5, "p50_s": 1.1, "p99_s": 2.9},
    "writes_to_ready": {
        "per_cr": {"operator_total": 5.0, "cr": 1.0, "cr_status": 2.0, "secret": 1.0, "event": 1.0}
    },
    "idle": {"writes_total": 3, "writes": {"operator_total": 0, "other": {"leases PUT": 3}}},
    "restart": {"aws_per_cr": 0.25, "aws_calls": {"operator_total": 3}, "crs_ready": 12},
    "changes": {"reflected": 3, "p50_s": 0.3, "p99_s": 0.9},
    "delete": {"all_gone_seconds": 4.5},
    "cloud_resources_left": {
        "total": 1,
        "databaseinstances": 0,
        "s3buckets": 1,
        "queues": 0,
        "topics": 0,
    },
    "operator": {"peak_rss_mb": 98.7, "cpu_seconds": 12.3},
    "aws_to_ready": {"per_cr": 7.11, "per_cr_by_kind": {"S3Bucket": 8.0, "Queue": 4.0}},
}


def _rows(text: str) -> dict[str, str]:
    """label -> the rest of its line, for the rows of the rendered table."""
    lines = text.splitlines()[2:]
    width = text.splitlines()[1].index(" ")
    return {line[:width].strip(): line[width:].strip() for line in lines}


def test_every_declared_row_is_rendered_with_its_verdict():
    doc = figures(OPTS, split_mix(OPTS.n, OPTS.mix), RESULTS, {"sha256": "abc"})
    rows = _rows(table(doc))
    shown = [row for row in ROWS if row.when is None or row.when(doc)]
    assert len(rows) == len(shown) < len(ROWS)  # the aws-like rows are left out
    assert not any("bound" in label for label in rows)
    assert rows["create time (api, 16 at once)"] == "0.46 s"
    assert rows["time to all Ready (from first create)"].split() == [
        "71.50",
        "s",
        "<",
        "60",
        "s",
        "MISSED",
    ]
    left = rows["cloud resources left (databaseinstances/s3buckets/queues/topics)"]
    assert left.split() == ["1", "(0/1/0/0)", "0", "MISSED"]
    assert rows["= without Events"].split() == ["4.00", "<=", "4", "ok"]
    assert rows["writes during idle (2 s): operator"].split() == ["0", "0", "ok"]
    assert rows["operator args"] == "--workers=8"
    assert rows["AWS calls per CR in the first 30 s after a restart"].split() == [
        "0.25",
        "(3",
        "calls,",
        "12",
        "CRs)",
        "<=",
        "0.2",
        "MISSED",
    ]
    assert rows[f"mix {':'.join(k.mix for k in KINDS)}"] == "1:1:1:1 (3/3/3/3)"


def test_phases_that_did_not_run_read_n_a_and_have_no_verdict():
    results = {k: v for k, v in RESULTS.items() if k not in ("idle", "restart", "changes", "ready")}
    rows = _rows(table(figures(OPTS, split_mix(12, "1:1:1:1"), results, {"sha256": "abc"})))
    assert rows["time to all Ready (from first create)"].split() == ["n/a", "<", "60", "s"]
    assert rows["per-CR time to Ready p50 / p99"] == "n/a / n/a"
    assert rows["writes during idle (2 s): operator"].split() == ["n/a", "0"]
    assert rows["AWS calls per CR in the first 30 s after a restart"].split() == [
        "n/a",
        "<=",
        "0.2",
    ]
    assert rows["spec-change latency p50 / p99 (0 changes)"].split() == [
        "n/a",
        "p99",
        "<",
        "2",
        "s",
    ]


def test_summary_is_the_tables_figures_by_name():
    doc = figures(OPTS, split_mix(12, "1:1:1:1"), RESULTS, {"sha256": "abc"})
    got = summary(doc)
    assert got["n"] == 12 and got["kinds"] == {k.kind: 3 for k in KINDS}
    assert got["all_ready_seconds"] == 71.5
    assert got["cloud_resources_left"] == 1
    assert got["api_writes_per_cr_to_ready_split"] == {
        "cr": 1.0,
        "cr_status": 2.0,
        "secret": 1.0,
        "event": 1.0,
    }
    assert got["idle_operator_writes"] == 0
    assert got["change_p99_s"] == 0.9
    assert got["restart_aws_calls_per_cr"] == 0.25
    assert summary(figures(OPTS, {}, {}, {}))["all_ready_seconds"] is None


# What the aws-like proxy's stats say after a run (GET /__profile__/stats, abridged).
PROXY_STATS = {
    "calls": 1210,
    "throttles": 7,
    "calls_by_action": {
        "rds.CreateDBInstance": 10,
        "rds.DescribeDBInstances": 400,
        "sqs.ListQueueTags": 800,
    },
    "throttles_by_action": {"sqs.ListQueueTags": 7},
    "buckets": {
        "rds.*DescribeDBInstances": {
            "burst": 300,
            "rate": 12,
            "per": "account",
            "instances": 1,
            "calls": 400,
            "calls_total": 400,
            "throttled": 0,
        },
        "rds.*CreateDBInstance": {
            "burst": 300,
            "rate": 12,
            "per": "account",
            "instances": 1,
            "calls": 10,
            "calls_total": 10,
            "throttled": 0,
        },
        "sqs.tagging": {
            "burst": 5,
            "rate": 5,
            "per": "account",
            "instances": 1,
            "calls": 793,
            "calls_total": 793,
            "throttled": 7,
        },
    },
    "durations_drawn": {"rds.create": {"count": 10, "max_s": 23.5, "mean_s": 16.0}},
}


def test_the_bound_is_the_busiest_bucket_or_the_longest_creating_state():
    bound = cloud_bound(PROXY_STATS, all_ready_s=180.0)
    assert bound["buckets"]["sqs.tagging"]["bound_s"] == (793 - 5) / 5
    assert bound["buckets"]["rds.*DescribeDBInstances"]["bound_s"] == round(100 / 12, 2)
    assert bound["buckets"]["rds.*CreateDBInstance"]["bound_s"] == 0
    assert bound["rate_binding"] == "sqs.tagging" and bound["dominated_by"] == "sqs.tagging"
    assert bound["bound_s"] == 157.6 and bound["ratio"] == round(180 / 157.6, 3)
    assert bound["calls_by_service"] == {"rds": 410, "sqs": 800}
    slow = cloud_bound({**PROXY_STATS, "buckets": {}}, all_ready_s=30.0)
    assert slow["bound_s"] == 23.5 and slow["dominated_by"] == "rds.create"
    assert cloud_bound({}, all_ready_s=1.0)["ratio"] is None


def test_the_paced_bound_counts_only_the_calls_of_crs_created_later():
    # 400 queues, 2 tagging calls each: 200 at once, 200 more at t = 100 s. The first 200
    # take (400 - 5) / 5 = 79 s; the later ones cannot start before 100 s: 100 + 395 / 5.
    at = [0.0] * 200 + [100.0] * 200
    assert paced(at, calls=800, burst=5, rate=5) == 100 + (400 - 5) / 5
    assert paced([], calls=800, burst=5, rate=5) == (800 - 5) / 5
    stats = {**PROXY_STATS, "durations_drawn": {"rds.create": {"max_s": 23.5, "min_s": 8.5}}}
    bound = cloud_bound(stats, 200.0, {"sqs": at, "rds": [0.0, 150.0]})
    assert bound["bound_s"] == 157.6  # every CR there from the start
    # 793 calls by 400 queues: the last 200 make 396.5 of them, from 100 s on.
    assert bound["paced_rate_bound_s"] == 178.3
    assert bound["paced_slow_bound_s"] == 158.5  # the last DB: 150 + 8.5
    assert bound["paced_bound_s"] == 178.3 and bound["paced_dominated_by"] == "sqs.tagging"
    assert bound["paced_ratio"] == round(200 / 178.3, 3)


def test_aws_like_rows_only_with_that_profile():
    opts = dataclasses.replace(OPTS, cloud_profile="aws-like", time_scale="30")
    results = {
        **RESULTS,
        "aws_like": {
            "time_scale": 30.0,
            "durations_seconds": {"rds.create": [8, 24]},
            **cloud_bound(PROXY_STATS, all_ready_s=220.0),
        },
        "synced_false": {
            "total": 3,
            "throttling": 1,
            "by_class": {"resource busy": 2, "throttling": 1},
        },
    }
    doc = figures(opts, split_mix(12, "1:1:1:1"), results, {"sha256": "abc"})
    rows = _rows(table(doc))
    # The instant cloud's targets are not applied.
    assert rows["time to all Ready (from first create)"] == "71.50 s"
    assert rows["time to all deleted"] == "4.50 s"
    assert rows["spec-change latency p50 / p99 (3 changes)"] == "0.30 s / 0.90 s"
    assert rows["Event"] == "1.00"
    assert rows["cloud profile, time scale (RDS creating)"] == "aws-like, 30 (8-24 s)"
    assert rows["Synced=False seen (WATCH, whole run)"].split()[-3:] == [
        "0",
        "throttling",
        "MISSED",
    ]
    assert rows["bound set by the cloud: max(rate, RDS creating)"] == "157.60 s (from sqs.tagging)"
    assert (
        "sqs.tagging: 793 calls, 5/s after a burst of 5"
        in rows["rate: (calls - burst) / rate, busiest bucket"]
    )
    assert rows["time to all Ready / bound"].split() == ["1.40x", "<=", "1.3x", "MISSED"]
    got = summary(doc)
    assert got["cloud_bound_seconds"] == 157.6 and got["synced_false_throttling"] == 1


def test_synced_false_messages_are_classified():
    assert classify("ReconcileError", "cloud call failed, will retry: Rate exceeded") == (
        "throttling"
    )
    assert classify(
        "ReconcileError", "cloud call failed, will retry: Rate exceeded (injected)"
    ) == ("injected fault")
    assert (
        classify(
            "ReconcileError", "cloud call failed, will retry: instance is backing-up; will retry"
        )
        == "resource busy"
    )
    assert classify("ReconcileError", "the cloud has not applied: spec.x") == (
        "change not applied yet"
    )
    assert classify("InvalidSpec", "the cloud refused the spec: no") == "other"
