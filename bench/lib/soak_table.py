"""The soak's table (and --json): what was done to the operator and the cloud, what it
cost, and what went wrong."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.lib.synced import describe


@dataclass(frozen=True)
class Soaked:
    """What one soak did and saw, for its table."""

    args: argparse.Namespace
    kinds: int  # kinds in the even mix
    accounts: int
    kills: int
    generation: int  # shard names handed out (--replicas)
    figures: Counter[str]
    stats: dict  # the fault proxy's
    synced: dict  # SyncedWatch.summary()
    cloud: dict | None  # the aws-like proxy's stats
    t_ready: float
    t_updated: float
    t_deleted: float
    total: float


def run_rows(s: Soaked) -> list[tuple[str, str]]:
    """What was done: the CRs, the cloud, the operators, their kills, the faults."""
    n, stats, cloud = s.args.n, s.stats, s.cloud
    profile = "instant (moto as it is)"
    if cloud is not None:
        profile = f"{cloud['profile']}, time scale {cloud['time_scale']:g}"
    return [
        ("CRs", f"{n} ({s.args.namespaces} namespaces, even mix of {s.kinds} kinds)"),
        ("AWS accounts", str(s.accounts or "the operator's own")),
        ("cloud profile", profile),
        (
            "operators",
            f"{s.args.replicas} sharded ({s.generation} shard names over the run)"
            if s.args.replicas
            else "1",
        ),
        ("operator kills (SIGKILL)", str(s.kills)),
        ("operator exits by themselves", str(s.figures["operator exits"])),
        ("API-server restarts", str(s.figures["apiserver restarts"])),
        ("AWS calls", f"{stats['total']} ({stats['total'] / n:.1f} per CR)"),
        (
            "injected AWS faults",
            f"{stats['injected']} ({100 * stats['injected'] / max(1, stats['total']):.0f}%): "
            + ", ".join(
                f"{k} {v}" for k, v in sorted(stats["by_outcome"].items()) if k != "forwarded"
            ),
        ),
        *(
            []
            if cloud is None
            else [
                (
                    "aws-like: calls, throttled, refused",
                    f"{cloud['calls']}, {cloud['throttles']}, {cloud['refusals']}"
                    + "".join(f"; {k} {v}" for k, v in sorted(cloud["refusals_by_action"].items())),
                )
            ]
        ),
    ]


def outcome_rows(s: Soaked) -> list[tuple[str, str]]:
    """What was seen: Synced=False, refusals, handovers, what was left, and the times."""
    figures = s.figures
    return [
        ("Synced=False seen (WATCH)", describe(s.synced)),
        (
            "invalid manifests refused",
            f"{figures['invalid refused']} of {figures['invalid applied']}",
        ),
        ("created for invalid manifests", str(figures["created for invalid"])),
        *(
            [
                ("handovers (AWS calls by a new replica)", str(figures["handovers"])),
                (
                    "resources acted on by two replicas at once",
                    str(figures["acted on by two at once"]),
                ),
            ]
            if s.args.replicas
            else []
        ),
        ("duplicates", str(figures["duplicates"])),
        ("leaks", str(figures["leaks"])),
        ("stuck Terminating", str(figures["stuck terminating"])),
        ("Secrets missing", str(figures["secrets missing"])),
        ("time to all Ready", f"{s.t_ready:.1f} s"),
        ("time to all updated", f"{s.t_updated:.1f} s"),
        ("time to all deleted", f"{s.t_deleted:.1f} s"),
        ("time taken", f"{s.total:.1f} s"),
    ]


def print_table(s: Soaked) -> None:
    """The table on stdout; with --json, the figures there too."""
    rows = run_rows(s) + outcome_rows(s)
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    if s.args.json:
        Path(s.args.json).write_text(
            json.dumps(
                {
                    "kills": s.kills,
                    "aws": s.stats,
                    "cloud_profile": s.cloud,
                    "synced_false": s.synced,
                    **s.figures,
                    "ready_s": s.t_ready,
                    "updated_s": s.t_updated,
                    "deleted_s": s.t_deleted,
                    "total_s": s.total,
                },
                indent=2,
            )
        )
