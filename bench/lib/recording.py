"""AWS calls, counted from moto's request recording (MOTO_ENABLE_RECORDING)."""

from __future__ import annotations

import base64
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

# The bench's own boto3 calls carry this in their User-Agent, and are not counted.
BENCH_USER_AGENT = "provisioner-bench"


class Recording:
    """moto's request recording: one JSON line per request; and moto's access log."""

    CREDENTIAL = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/")

    def __init__(self, path: Path, access_log: Path) -> None:
        self.path = path
        self.access_log = access_log

    def mark(self) -> tuple[int, int]:
        """Where the recording and moto's access log end now."""
        return self._end(self.path), self._end(self.access_log)

    @staticmethod
    def _end(path: Path) -> int:
        """The offset just past the last complete line."""
        try:
            with path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
        except FileNotFoundError:
            return 0
        cut = tail.rfind(b"\n")
        return size - len(tail) + cut + 1 if cut >= 0 else size - len(tail)

    @staticmethod
    def _read(path: Path, start: int, end: int) -> bytes:
        if end <= start or not path.exists():
            return b""
        with path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def calls(self, start_mark: tuple[int, int], end_mark: tuple[int, int]) -> dict[str, Any]:
        """Requests between two marks: the operator's by service and action, the bench's, and
        the HTTP status codes moto answered (its access log: every client, bench included)."""
        by_action: Counter[str] = Counter()
        by_service: Counter[str] = Counter()
        # By the app id in the user agent (app/<id>): sharded replicas name themselves there.
        by_app: Counter[str] = Counter()
        codes: Counter[str] = Counter()
        bench = 0
        for line in self._read(self.access_log, start_mark[1], end_mark[1]).splitlines():
            parts = line.decode(errors="replace").rsplit(" ", 2)
            if len(parts) == 3 and parts[1].isdigit() and '"' in parts[0]:
                codes[parts[1]] += 1
        for line in self._read(self.path, start_mark[0], end_mark[0]).splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
            if BENCH_USER_AGENT in headers.get("user-agent", ""):
                bench += 1
                continue
            app = next(
                (p[4:] for p in headers.get("user-agent", "").split() if p.startswith("app/")),
                None,
            )
            if app:
                by_app[app] += 1
            service, action = self.classify(entry, headers)
            by_service[service] += 1
            by_action[f"{service}:{action}"] += 1
        return {
            "operator_total": sum(by_service.values()),
            "by_service": dict(sorted(by_service.items())),
            "by_action": dict(by_action.most_common()),
            "by_app": dict(sorted(by_app.items())),
            "bench_requests": bench,
            "moto_status_codes": dict(sorted(codes.items())),
        }

    def classify(self, entry: dict[str, Any], headers: dict[str, str]) -> tuple[str, str]:
        found = self.CREDENTIAL.search(headers.get("authorization", ""))
        service = found.group(1) if found else "unknown"
        target = headers.get("x-amz-target", "")
        if target:
            return service, target.rsplit(".", 1)[-1]
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            body = base64.b64decode(body).decode(errors="replace")
        if "Action=" in body:
            return service, parse_qs(body).get("Action", ["?"])[0]
        url = urlsplit(entry.get("url", ""))
        if "Action=" in url.query:
            return service, parse_qs(url.query).get("Action", ["?"])[0]
        method = entry.get("method", "?")
        if service == "s3":
            sub = url.query.split("=", 1)[0].split("&", 1)[0]
            parts = [p for p in url.path.split("/") if p]
            what = f"?{sub}" if sub else ("object" if len(parts) > 1 else "bucket")
            return service, f"{method} {what}"
        return service, method


def replica_turns(path: Path, names: list[str], start: int = 0) -> dict[str, list[str]]:
    """Per cloud name, the replicas (the app id in each call's user agent) that called the
    cloud naming it, in moto's order, consecutive calls of one replica collapsed: a resource
    handed over once shows two, one that two replicas acted on at once shows one twice.
    `start`: the recording's lines before it are left out."""
    turns: dict[str, list[str]] = {n: [] for n in names}
    if not path.exists():
        return turns
    with path.open(errors="replace") as f:
        for number, line in enumerate(f):
            if number < start:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
            app = next(
                (p[4:] for p in str(headers.get("user-agent", "")).split() if p.startswith("app/")),
                None,
            )
            if app is None:
                continue
            body = entry.get("body") or ""
            if entry.get("body_encoded"):
                body = base64.b64decode(body).decode(errors="replace")
            text = f"{entry.get('url', '')} {body}"
            for name in names:
                if name in text and (not turns[name] or turns[name][-1] != app):
                    turns[name].append(app)
    return turns


def overlapping(turns: dict[str, list[str]]) -> dict[str, list[str]]:
    """The resources a replica came back to after another had acted on them."""
    return {name: seq for name, seq in turns.items() if len(seq) != len(set(seq))}
