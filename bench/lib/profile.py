"""py-spy attached to the operator during the create phase, and its samples summarised."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.lib.measure import ROOT


class PySpy:
    """`py-spy record --pid` attached to the operator for the create phase."""

    MODES = {"cpu": [], "gil": ["--gil"], "wall": ["--idle"]}

    def __init__(self, pid: int, output: Path, rate: int, mode: str = "cpu") -> None:
        self.pid = pid
        self.output = output
        self.rate = rate
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def executable() -> str:
        here = Path(sys.executable).parent / "py-spy"
        found = str(here) if here.exists() else shutil.which("py-spy")
        if not found:
            raise SystemExit("--py-spy needs py-spy: .venv/bin/pip install py-spy")
        return found

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.executable(),
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--output",
                str(self.output),
                "--rate",
                str(self.rate),
                "--nonblocking",
                *self.MODES[self.mode],
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.output.parent / "py-spy.log").open("ab"),
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


FRAME_LINE = re.compile(r":\d+\)$")
# (area, substrings of the whole stack): the first that matches names a sample's area.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cloud threads: boto3 TCP connect/close", ("Aws.call",)),  # refined below
    ("cloud threads: Kubernetes API calls (Secrets, status)", ("Kube.request",)),
    ("event loop: logging", ("logging/",)),
    ("event loop: kopf watch streams", ("kopf/_cogs/clients/watching",)),
    ("event loop: kopf posting Events", ("kopf/_core/engines/posting", "clients/events")),
    ("event loop: kopf patching", ("kopf/_cogs/clients/patching",)),
    ("event loop: kopf daemons", ("kopf/_core/engines/daemons",)),
    (
        "event loop: provisioner handlers",
        ("provisioner/runtime/", "provisioner/reconciler/"),
    ),
    ("event loop: kopf queueing, processing, diffs", ("kopf/",)),
    ("idle executor threads", ("concurrent/futures/thread.py",)),
)
# Frames every sample of a thread passes through: left out of the inclusive ranking.
GENERIC_FRAMES = (
    "<frozen",
    "asyncio/",
    "threading.py",
    "concurrent/futures/",
    "provisioner/__main__.py",
    "provisioner/cli.py",
    "Reconciler.run.<locals>",
    "botocore/context.py",
)
CONNECTING = ("create_connection", "getaddrinfo", "_real_close", "socket.__init__", "_new_conn")
SOCKET_WAIT = ("readinto", "SSLSocket.read", "do_poll", "select")
# Path prefixes cut from frames: the packages' and the standard library's, and this checkout.
PATH_MARKERS = (
    "site-packages/",
    f"lib/python{sys.version_info.major}.{sys.version_info.minor}/",
    f"{ROOT}/",
)


def area_of(stack: str, leaf: str) -> str:
    for area, needles in AREAS:
        if any(n in stack for n in needles):
            if area.startswith("cloud threads: boto3"):
                if any(n in stack for n in CONNECTING):
                    return "cloud threads: boto3 TCP connect/close"
                if any(n in leaf for n in SOCKET_WAIT):
                    return "cloud threads: boto3 socket I/O"
                return "cloud threads: boto3 request building, signing, parsing"
            return area
    if "EpollSelector.select" in leaf:
        return "event loop: waiting in epoll"
    if any(n in stack for n in ("aiohttp/", "SSLObject", "asyncio/selector_events")):
        return "event loop: aiohttp and TLS I/O (kopf's API calls)"
    return "other"


def shorten(frame: str) -> str:
    for marker in PATH_MARKERS:
        if marker in frame:
            head, _, tail = frame.partition("(")
            return f"{head}({tail.split(marker, 1)[-1]}"
    return frame


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"samples": 0, "areas": [], "self": [], "inclusive": []}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        areas[area_of(stack, stack.rsplit(";", 1)[-1])] += n
        frames = [shorten(FRAME_LINE.sub(")", f)) for f in stack.split(";") if f]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] += n
        for f in set(frames):
            if not any(g in f for g in GENERIC_FRAMES):
                inclusive[f] += n

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": n, "percent": round(100 * n / total, 1)}
            for f, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "areas": rows(areas),
        "self": rows(own),
        "inclusive": rows(inclusive),
    }


def profile_text(profile: dict[str, Any], top: int = 15) -> str:
    lines = [
        f"py-spy profile of the operator ({profile.get('mode', 'cpu')} mode), create -> all Ready"
        f" ({profile['samples']} samples)"
    ]
    for title, key in (("area", "areas"), ("self", "self"), ("inclusive", "inclusive")):
        lines.append(f"  top by {title}:")
        for row in profile[key][:top]:
            lines.append(f"    {row['percent']:5.1f}%  {row['function']}")
    return "\n".join(lines)
