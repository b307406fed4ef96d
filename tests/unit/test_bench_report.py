"""bench/converge.py's table and summary, from figures alone (the run is tested end to end
by tests/e2e/test_bench_smoke.py)."""

from __future__ import annotations

from bench.lib.report import ROWS, figures, summary, table
from bench.lib.run import Options
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
    assert len(rows) == len(ROWS)
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
