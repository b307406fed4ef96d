"""Starting, waiting for and stopping the local processes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class StartError(RuntimeError):
    """A process did not come up; the message says which and where its log is."""


def free_port() -> int:
    """A loopback port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fixed_port() -> int:
    """A free loopback port below the kernel's ephemeral range, for a server that is restarted
    on the same port: a port from `free_port()` is ephemeral, and any outgoing connection may
    be given it while the server is down (the restart then fails: address already in use)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def wait_port_released(port: int, timeout: float = 30.0) -> None:
    """Wait until a server may listen on loopback `port` again (bound as Go binds, with
    SO_REUSEADDR): a process just stopped may leave its sockets to the kernel a while."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                pass
            else:
                return
        if time.monotonic() > deadline:
            held = ", ".join(sockets_on(port)) or "nothing in /proc/net/tcp"
            raise StartError(f"port {port} is not released after {timeout:g}s; held by: {held}")
        time.sleep(0.1)


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def sockets_on(port: int) -> list[str]:
    """The kernel's IPv4 TCP sockets bound to local `port`, as `STATE local -> remote`."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if int(local.rsplit(":", 1)[1], 16) == port:
                found.append(f"{TCP_STATES.get(state, state)} {local} -> {remote}")
    return found


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session (so it outlives the caller and can be stopped whole)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0): look at its state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process for good.

    A pid alone may be reused by an unrelated process once its owner died.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def same_alive(pid: int, started: int | None) -> bool:
    """`pid` is alive and is still the process that started at `started` (when known)."""
    if not alive(pid):
        return False
    return started is None or start_time(pid) in (None, started)


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL what is left after `timeout`, reap if ours."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid):
                return
            time.sleep(0.05)


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until it is true; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"{what} exited with code {proc.returncode}; {_tail(log)}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001, S110 - any failure means "not yet"
            pass
        if time.monotonic() > deadline:
            raise StartError(f"{what} not ready after {timeout:.0f}s; {_tail(log)}")
        time.sleep(interval)


@dataclass(kw_only=True)
class LoopbackService:
    """A child process serving HTTP on a loopback port: start it, wait until ready, stop it."""

    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(
        self,
        args: list[str],
        ready: Callable[[], bool],
        *,
        what: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.proc = spawn(args, self.log, env=env)
        wait_until(ready, timeout=timeout, what=what, proc=self.proc, log=self.log)

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            stop(self.proc.pid, timeout=timeout)
        self.proc.wait()
        self.proc = None


def _tail(log: Path | None) -> str:
    if log is None:
        return "no log"
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"see {log}"
    last = lines[-1][:300] if lines else "(empty)"
    return f"last log line: {last} (full log: {log})"
