"""bench/ack.py's table: the two controllers in columns, its targets, the calls made."""

from __future__ import annotations

from typing import Any

# Targets of this comparison (bench/README.md).
CALLS_PER_BUCKET_TARGET = 6.0
RSS_RATIO_TARGET = 1.2


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    """Ours at most 6 AWS calls per bucket to Ready; our peak RSS at most 1.2x ACK's."""
    ours, ack = doc.get("ours") or {}, doc.get("ack") or {}
    calls = ours.get("aws_calls_per_bucket")
    ratio = None
    if ours.get("peak_rss_mb") and ack.get("peak_rss_mb"):
        ratio = round(ours["peak_rss_mb"] / ack["peak_rss_mb"], 2)
    return {
        "calls_per_bucket": {
            "value": calls,
            "target": CALLS_PER_BUCKET_TARGET,
            "met": None if calls is None else calls <= CALLS_PER_BUCKET_TARGET,
        },
        "peak_rss_ratio": {
            "value": ratio,
            "target": RSS_RATIO_TARGET,
            "met": None if ratio is None else ratio <= RSS_RATIO_TARGET,
        },
    }


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return f"{text}{unit}"


def _verdict(check: dict[str, Any]) -> str:
    met = check.get("met")
    return "-" if met is None else ("met" if met else "MISSED")


ROWS: list[tuple[str, str, str, int]] = [
    ("buckets created", "created", "", 2),
    ("create time", "create_seconds", " s", 1),
    ("time to all Ready/Synced", "all_ready_seconds", " s", 1),
    ("per-bucket time to Ready p50", "time_to_ready_p50_s", " s", 1),
    ("per-bucket time to Ready p99", "time_to_ready_p99_s", " s", 1),
    ("AWS calls per bucket to Ready", "aws_calls_per_bucket", "", 2),
    ("  of them until all Ready", "aws_calls_per_bucket_at_all_ready", "", 2),
    ("RSS before the first CR", "rss_before_first_cr_mb", " MB", 1),
    ("RSS max, create -> all Ready", "rss_max_create_to_ready_mb", " MB", 1),
    ("peak RSS (VmHWM at the end)", "peak_rss_mb", " MB", 1),
    ("  at all Ready: anonymous", "rss_anon_at_all_ready_mb", " MB", 1),
    ("  at all Ready: file-backed", "rss_file_at_all_ready_mb", " MB", 1),
    ("CPU seconds, create -> all Ready", "cpu_seconds_create_to_ready", "", 2),
    ("API writes per CR to Ready", "api_writes_per_cr_to_ready", "", 2),
    ("time to all deleted", "all_deleted_seconds", " s", 1),
    ("AWS calls per bucket to delete", "aws_calls_per_bucket_to_delete", "", 2),
    ("buckets left in moto", "buckets_left_in_moto", "", 2),
]


def table(doc: dict[str, Any]) -> str:
    """The two controllers in columns, the targets after them, then which calls were made."""
    sides = [k for k in ("ack", "ours") if doc.get(k)]
    heads = [doc[k]["controller"] for k in sides]
    width = max(24, *(len(h) + 2 for h in heads))
    lines = [f"{'':34}" + "".join(f"{h:<{width}}" for h in heads)]
    for label, key, unit, digits in ROWS:
        cells = "".join(f"{_fmt(doc[k].get(key), unit, digits):<{width}}" for k in sides)
        lines.append(f"{label:34}{cells}".rstrip())
    t = doc.get("targets") or targets(doc)
    calls, ratio = t["calls_per_bucket"], t["peak_rss_ratio"]
    lines.append("")
    lines.append(
        f"target: ours <= {calls['target']:g} AWS calls per bucket to Ready: "
        f"{_fmt(calls['value'])} {_verdict(calls)}"
    )
    lines.append(
        f"target: our peak RSS <= {ratio['target']:g}x ACK's: {_fmt(ratio['value'], 'x')} "
        f"{_verdict(ratio)}"
    )
    for k in sides:
        side = doc[k]
        calls_doc = side.get("aws_calls") or {}
        created = max(1, side.get("created") or 1)
        per = ", ".join(
            f"{action} {count / created:.2f}"
            for action, count in (calls_doc.get("by_action") or {}).items()
        )
        unnamed = ", ".join(
            f"{action} {count}"
            for action, count in (calls_doc.get("naming_no_bucket") or {}).items()
        )
        lines.append("")
        lines.append(f"{side['controller']}: calls per bucket to Ready by action: {per or '-'}")
        lines.append(f"  naming no bucket (total): {unnamed or '-'}")
        spread = calls_doc.get("per_named_bucket") or {}
        lines.append(
            f"  per bucket named: min {_fmt(spread.get('min'))}, p50 {_fmt(spread.get('p50'))}, "
            f"max {_fmt(spread.get('max'))} over {calls_doc.get('buckets_named', 0)} buckets"
        )
        for problem in side.get("errors") or []:
            lines.append(f"  FAILED: {problem}")
    return "\n".join(lines)
