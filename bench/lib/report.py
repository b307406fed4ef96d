"""What the benchmark prints and writes: the summary figures and the table, both declared.

Every figure is named by its path in one document (the options, the source fingerprint and
the results of the phases: `ready.p50_s`, `opts.n`, ...). A table row is a label, a value
(a template over such paths, or a function of the document), a target and a check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.lib.options import Options
from bench.lib.synced import describe as describe_synced
from bench.lib.workload import KINDS, MIX_NAMES

Doc = dict[str, Any]


def figures(
    opts: Options, counts: dict[str, int], results: dict[str, Any], source: dict[str, Any]
) -> Doc:
    """The one document the summary and the table read, with the few derived figures."""
    per_cr = (results.get("writes_to_ready") or {}).get("per_cr") or {}
    idle_other = ((results.get("idle") or {}).get("writes") or {}).get("other") or {}
    aws_by_kind = (results.get("aws_to_ready") or {}).get("per_cr_by_kind") or {}
    derived = {
        "writes_without_events": round(per_cr["cr"] + per_cr["cr_status"] + per_cr["secret"], 3)
        if per_cr
        else None,
        "idle_others": ", ".join(f"{k} {v}" for k, v in idle_other.items()) or "0",
        "aws_by_kind": ", ".join(f"{k} {v:.1f}" for k, v in sorted(aws_by_kind.items())),
        "idle_aws_by_kind": ", ".join(
            f"{k} {v:.1f}"
            for k, v in sorted(
                ((results.get("idle") or {}).get("aws_per_cr_hour_by_kind") or {}).items()
            )
        ),
        "changes_reflected": (results.get("changes") or {}).get("reflected", 0),
        **_aws_like(results),
    }
    doc = {**results, "opts": asdict(opts), "kinds": counts, "source": source}
    return {**doc, "cpus": os.cpu_count(), "derived": derived}


def _services(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "0"


def _aws_like(results: dict[str, Any]) -> dict[str, Any]:
    """The aws-like figures in words: calls by service, the bound and what sets it."""
    aws = results.get("aws_like")
    if not aws:
        return {}
    buckets = aws["buckets"]
    slowest = sorted(buckets, key=lambda b: buckets[b]["bound_s"], reverse=True)[:3]
    binding = aws["rate_binding"]
    if binding:
        row = buckets[binding]
        rate = (
            f"{binding}: {row['calls']} calls, {row['rate']:g}/s after a burst of {row['burst']:g}"
        )
    else:
        rate = "no throttled action used"
    rds = (aws.get("durations_seconds") or {}).get("rds.create")
    synced = results.get("synced_false")
    return {
        "aws_calls": _services(aws["calls_by_service"]),
        "aws_throttled": _services(aws["throttled_by_service"]),
        "bound_rate": rate,
        "bound_buckets": ", ".join(f"{b} {buckets[b]['bound_s']:.1f} s" for b in slowest) or "-",
        "rds_creating": "" if not rds else f"{rds[0]:g}-{rds[1]:g} s",
        "synced_false": describe_synced(synced) if synced else None,
    }


def aws_like(doc: Doc) -> bool:
    return (doc.get("opts") or {}).get("cloud_profile") == "aws-like"


def instant(doc: Doc) -> bool:
    return not aws_like(doc)


def lookup(doc: Doc, path: str) -> Any:
    """`a.b.c` in the document; None where any part is missing."""
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


# -- the summary (the JSON's top level) -------------------------------------------------------

SUMMARY: dict[str, Any] = {
    "n": "opts.n",
    "mix": "opts.mix",
    "kinds": "kinds",
    "namespaces": "opts.namespaces",
    "create_seconds": "create.create_seconds",
    "all_ready_seconds": "ready.all_ready_seconds",
    "ready_p50_s": "ready.p50_s",
    "ready_p99_s": "ready.p99_s",
    "all_deleted_seconds": "delete.all_gone_seconds",
    "cloud_resources_left": "cloud_resources_left.total",
    "operator_peak_rss_mb": "operator.peak_rss_mb",
    "operator_cpu_seconds": "operator.cpu_seconds",
    "api_writes_per_cr_to_ready": "writes_to_ready.per_cr.operator_total",
    "api_writes_per_cr_to_ready_split": {
        part: f"writes_to_ready.per_cr.{part}" for part in ("cr", "cr_status", "secret", "event")
    },
    "idle_writes": "idle.writes_total",
    "idle_operator_writes": "idle.writes.operator_total",
    "restart_aws_calls_per_cr": "restart.aws_per_cr",
    "change_p50_s": "changes.p50_s",
    "change_p99_s": "changes.p99_s",
    "aws_calls_per_cr_to_ready": "aws_to_ready.per_cr",
    "cloud_profile": "opts.cloud_profile",
    "time_scale": "aws_like.time_scale",
    "cloud_bound_seconds": "aws_like.bound_s",
    "all_ready_to_bound_ratio": "aws_like.ratio",
    "cloud_bound_paced_seconds": "aws_like.paced_bound_s",
    "all_ready_to_paced_bound_ratio": "aws_like.paced_ratio",
    "aws_throttles_to_ready": "aws_like.throttled_total",
    "synced_false_seen": "synced_false.total",
    "synced_false_throttling": "synced_false.throttling",
}


def summary(doc: Doc, spec: Any = None) -> Any:
    spec = SUMMARY if spec is None else spec
    if isinstance(spec, dict):
        return {key: summary(doc, value) for key, value in spec.items()}
    return lookup(doc, spec)


# -- the table ----------------------------------------------------------------------------------

Value = Callable[[Doc], str]
Check = Callable[[Doc], bool | None]
FIELD = re.compile(r"\{([\w.]+)(?::([^}]*))?\}")


def template(text: str, needs: str | None = None, missing: str = "n/a") -> Value:
    """`text` with each `{path}` or `{path:format}` filled in; `missing` where `needs` (or a
    formatted figure) is absent, and `?` for an absent figure in plain text."""

    def fill(doc: Doc) -> str:
        if needs is not None and not lookup(doc, needs):
            return missing

        def one(match: re.Match[str]) -> str:
            value = lookup(doc, match[1])
            if value is None:
                if match[2]:
                    raise LookupError(match[1])
                return "?"
            return format(value, match[2] or "")

        try:
            return FIELD.sub(one, text)
        except LookupError:
            return missing

    return fill


def seconds(path: str, digits: int = 2) -> Value:
    """The figure in seconds, or n/a."""

    def fill(doc: Doc) -> str:
        value = lookup(doc, path)
        return "n/a" if value is None else f"{value:.{digits}f} s"

    return fill


def pair(a: Value, b: Value, needs: str | None = None) -> Value:
    """`a / b`; n/a where `needs` is absent."""
    return lambda doc: "n/a" if needs and not lookup(doc, needs) else f"{a(doc)} / {b(doc)}"


def below(path: str, limit: float) -> Check:
    return lambda doc: None if lookup(doc, path) is None else lookup(doc, path) < limit


def at_most(path: str, limit: float) -> Check:
    return lambda doc: None if lookup(doc, path) is None else lookup(doc, path) <= limit


def equals(path: str, expected: Any) -> Check:
    return lambda doc: None if lookup(doc, path) is None else lookup(doc, path) == expected


@dataclass(frozen=True)
class Row:
    label: str  # a template too: `{opts.idle:.0f}`
    value: Value
    target: str = ""
    check: Check | None = None
    # Shown only where this holds (e.g. the aws-like figures with that cloud profile alone).
    when: Callable[[Doc], bool] | None = None
    # The target (and its check) holds only where this does (the instant cloud's targets).
    target_when: Callable[[Doc], bool] | None = None


def _operator_args(doc: Doc) -> str:
    return " ".join(doc["opts"]["operator_args"]) or "(defaults)"


def _replicas(doc: Doc) -> str:
    """Per sharded replica: CRs held at all Ready, AWS calls to Ready, peak RSS, CPU s."""
    return "; ".join(
        f"{r['shard']}: {r['crs']} CRs, {r['aws_calls_to_ready']} calls, "
        f"{r['peak_rss_mb']} MB, {r['cpu_seconds']} CPU s"
        for r in doc.get("replicas") or []
    )


_kind_counts = "/".join(f"{{kinds.{k.kind}}}" for k in KINDS)
_left = "/".join(f"{{cloud_resources_left.{k.left_key}}}" for k in KINDS)
_per_cr = "writes_to_ready.per_cr"

ROWS: tuple[Row, ...] = (
    Row("N", template("{opts.n}")),
    Row(f"mix {MIX_NAMES}", template(f"{{opts.mix}} ({_kind_counts})")),
    Row("namespaces", template("{opts.namespaces}")),
    Row("operator source (sha256 of provisioner/, crds/)", template("{source.sha256}")),
    Row("operator args", _operator_args),
    Row(
        "sharded replicas ({opts.replicas})",
        _replicas,
        when=lambda doc: bool(doc["opts"].get("sharding")),
    ),
    Row(
        "machine: CPUs, load avg 1m (start/Ready)",
        template("{cpus}, {loadavg_1m.create} / {loadavg_1m.ready}"),
    ),
    Row(
        "create time ({create.method}, {create.workers} at once)",
        seconds("create.create_seconds"),
    ),
    # The instant cloud's targets; the aws-like cloud's are set by its own limits, below.
    Row(
        "time to all Ready (from first create)",
        seconds("ready.all_ready_seconds"),
        "< 60 s",
        below("ready.all_ready_seconds", 60),
        target_when=instant,
    ),
    Row(
        "per-CR time to Ready p50 / p99",
        pair(seconds("ready.p50_s"), seconds("ready.p99_s")),
    ),
    Row(
        "time to all deleted",
        seconds("delete.all_gone_seconds"),
        "< 60 s",
        below("delete.all_gone_seconds", 60),
        target_when=instant,
    ),
    Row(
        f"cloud resources left ({'/'.join(k.left_key for k in KINDS)})",
        template(f"{{cloud_resources_left.total}} ({_left})", needs="cloud_resources_left"),
        "0",
        equals("cloud_resources_left.total", 0),
    ),
    Row(
        "operator peak RSS (VmHWM)",
        template("{operator.peak_rss_mb:.1f} MB"),
        "< 150 MB",
        below("operator.peak_rss_mb", 150),
    ),
    Row(
        "operator CPU seconds (total / to Ready)",
        pair(
            seconds("operator.cpu_seconds", 1),
            seconds("cpu_create_to_ready.operator", 1),
        ),
    ),
    Row(
        "API writes per CR to Ready (operator)",
        template(f"{{{_per_cr}.operator_total:.2f}}"),
        "<= 4 + 2 Events",
        target_when=instant,
    ),
    Row("  CR (finalizer, metadata)", template(f"{{{_per_cr}.cr:.2f}}")),
    Row("  CR status", template(f"{{{_per_cr}.cr_status:.2f}}")),
    Row("  Secret", template(f"{{{_per_cr}.secret:.2f}}")),
    Row(
        "  = without Events",
        template("{derived.writes_without_events:.2f}"),
        "<= 4",
        at_most("derived.writes_without_events", 4),
    ),
    Row(
        "  Event",
        template(f"{{{_per_cr}.event:.2f}}"),
        "<= 2",
        at_most(f"{_per_cr}.event", 2),
        # aws-like: each DatabaseInstance also posts `Creating` while it is creating.
        target_when=instant,
    ),
    Row(
        "writes during idle ({opts.idle:.0f} s): operator",
        template("{idle.writes.operator_total}", needs="idle"),
        "0",
        equals("idle.writes.operator_total", 0),
    ),
    Row("  others (resource verb count)", template("{derived.idle_others}", needs="idle")),
    Row(
        "AWS calls per CR per hour while idle (steady state)",
        template("{idle.aws_per_cr_hour:.1f} ({derived.idle_aws_by_kind})", needs="idle"),
    ),
    Row(
        "AWS calls per CR in the first {opts.restart:.0f} s after a restart",
        template(
            "{restart.aws_per_cr:.2f} ({restart.aws_calls.operator_total} calls, "
            "{restart.crs_ready} CRs)",
            needs="restart",
        ),
        "<= 0.2",
        at_most("restart.aws_per_cr", 0.2),
    ),
    Row(
        "spec-change latency p50 / p99 ({derived.changes_reflected} changes)",
        pair(seconds("changes.p50_s"), seconds("changes.p99_s"), needs="changes"),
        "p99 < 2 s",
        below("changes.p99_s", 2),
        # aws-like: a queue's pass reads its tags (ListQueueTags, 5 per second per account).
        target_when=instant,
    ),
    Row(
        "AWS calls per CR to Ready (moto recorder)",
        template("{aws_to_ready.per_cr:.2f} ({derived.aws_by_kind})", needs="aws_to_ready"),
    ),
    # -- the aws-like cloud ---------------------------------------------------------------------
    Row(
        "cloud profile, time scale (RDS creating)",
        template("{opts.cloud_profile}, {aws_like.time_scale:g} ({derived.rds_creating})"),
        when=aws_like,
    ),
    Row(
        "AWS calls to Ready at the aws-like proxy",
        template("{aws_like.calls_total} ({derived.aws_calls})", needs="aws_like"),
        when=aws_like,
    ),
    Row(
        "  throttled by it (absorbed by the call budget)",
        template("{aws_like.throttled_total} ({derived.aws_throttled})", needs="aws_like"),
        when=aws_like,
    ),
    Row(
        "Synced=False seen (WATCH, whole run)",
        template("{derived.synced_false}", needs="synced_false"),
        "0 throttling",
        equals("synced_false.throttling", 0),
        when=aws_like,
    ),
    Row(
        "bound set by the cloud: max(rate, RDS creating)",
        template("{aws_like.bound_s:.2f} s (from {aws_like.dominated_by})", needs="aws_like"),
        when=aws_like,
    ),
    Row(
        "  rate: (calls - burst) / rate, busiest bucket",
        template("{aws_like.rate_bound_s:.2f} s ({derived.bound_rate})", needs="aws_like"),
        when=aws_like,
    ),
    Row(
        "  rate, top buckets",
        template("{derived.bound_buckets}", needs="aws_like"),
        when=aws_like,
    ),
    Row(
        "  longest RDS creating drawn",
        seconds("aws_like.slow_bound_s"),
        when=aws_like,
    ),
    Row(
        "  paced by the creates (no CR handled before it exists)",
        template(
            "{aws_like.paced_bound_s:.2f} s (from {aws_like.paced_dominated_by})", needs="aws_like"
        ),
        when=aws_like,
    ),
    Row(
        "time to all Ready / bound",
        template("{aws_like.ratio:.2f}x", needs="aws_like"),
        "<= 1.3x",
        at_most("aws_like.ratio", 1.3),
        when=aws_like,
    ),
    Row(
        "time to all Ready / bound paced by the creates",
        template("{aws_like.paced_ratio:.2f}x", needs="aws_like"),
        "<= 1.3x",
        at_most("aws_like.paced_ratio", 1.3),
        when=aws_like,
    ),
)


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISSED")


def table(doc: Doc, rows: tuple[Row, ...] = ROWS) -> str:
    cells = []
    for row in rows:
        if row.when is not None and not row.when(doc):
            continue
        targeted = row.target_when is None or row.target_when(doc)
        check = row.check if targeted else None
        cells.append(
            (
                template(row.label, missing="?")(doc),
                row.value(doc),
                row.target if targeted else "",
                verdict(check(doc) if check else None),
            )
        )
    headers = ("figure", "value", "target", "")
    widths = [max(len(r[i]) for r in [headers, *cells]) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths[:3]))
    for r in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)
