"""A progress bar over a Go build: the packages compiled so far, and the time left."""

from __future__ import annotations

import sys
import time
from typing import Any


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class BuildProgress:
    """A progress bar over the Go packages a component's build compiles, with an estimate of
    the time left from the rate so far. On a terminal it redraws one line every second;
    otherwise (make, CI logs) it prints a line every 15 s."""

    WIDTH = 30

    def __init__(self, what: str, total: int, stream: Any = None) -> None:
        self.what = what
        self.total = max(1, total)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = 1.0 if self.tty else 15.0
        self.started = time.monotonic()
        self.last = self.started
        self.done = 0

    def line(self, now: float) -> str:
        share = min(self.done / self.total, 0.99)
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = now - self.started
        text = (
            f"{self.what}: [{bar}] {share * 100:3.0f}% "
            f"({self.done}/{self.total} packages), {_duration(elapsed)} so far"
        )
        if self.done >= 20 and elapsed > 0:
            left = (self.total - self.done) / (self.done / elapsed)
            text += f", about {_duration(left)} left"
        return text

    def compiled(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.show(now)

    def show(self, now: float) -> None:
        if self.tty:
            print(f"\rprovisioner: {self.line(now)}\033[K", end="", file=self.stream, flush=True)
        else:
            print(f"provisioner: {self.line(now)}", file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)
