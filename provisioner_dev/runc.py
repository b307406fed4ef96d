"""The operator's image run by runc, the way a kubelet would run the pod's container."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from provisioner_dev.image import ImageError, run_tool

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _bind(source: str | Path, destination: str) -> dict:
    return {
        "destination": destination,
        "type": "bind",
        "source": str(source),
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }


def runc_config(
    rootfs: Path, config: dict, args: list[str], env: dict[str, str], service_account: Path
) -> dict:
    """An OCI runtime config the way a kubelet would run the pod's container: the image's
    user, a read-only root, a tmpfs at /tmp, the ServiceAccount volume, no capabilities, and
    the host's network (the API server and the cloud are on its loopback)."""
    user = str(config.get("User") or "0")
    uid, _, gid = user.partition(":")
    image_env = dict(e.split("=", 1) for e in config.get("Env") or [])
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid or uid)},
            "args": [*(config.get("Entrypoint") or []), *args],
            "env": [f"{k}={v}" for k, v in {**image_env, **env}.items()],
            "cwd": config.get("WorkingDir") or "/",
            "capabilities": {k: [] for k in ("bounding", "effective", "permitted", "inheritable")},
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "mounts": _mounts(service_account),
        "linux": _linux(),
    }


def _mounts(service_account: Path) -> list[dict]:
    """A pod's container's mounts: its own /proc, /dev and /tmp, the host's /sys read-only,
    the ServiceAccount volume, and the host's names (its network is shared)."""
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        _bind("/sys", "/sys"),
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=64m"],
        },
        _bind(service_account, SERVICE_ACCOUNT_DIR),
        _bind("/etc/hosts", "/etc/hosts"),
        _bind("/etc/resolv.conf", "/etc/resolv.conf"),
    ]


def _linux() -> dict:
    """Its own pid, ipc and mount namespaces (not the network's), and /proc and /sys masked
    or read-only as a container runtime has them."""
    return {
        "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}],
        "maskedPaths": [
            "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
            "/sys/firmware",
        ],
        "readonlyPaths": [
            "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
            "/proc/sysrq-trigger",
        ],
    }  # fmt: skip


class RuncContainer:
    """The image run by runc from a bundle in `bundle_dir`; its output goes to `log`."""

    def __init__(self, name: str, bundle_dir: Path, log: Path) -> None:
        self.name = name
        self.bundle = bundle_dir
        self.log = log

    def create(self, config: dict) -> None:
        """Set up the container (mounts, namespaces) without starting its process."""
        self.bundle.mkdir(parents=True, exist_ok=True)
        (self.bundle / "config.json").write_text(json.dumps(config, indent=1))
        with self.log.open("ab") as out:
            result = subprocess.run(
                ["runc", "create", "--bundle", str(self.bundle), self.name],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                timeout=60,
            )
        if result.returncode != 0:
            raise ImageError(f"runc create failed ({result.returncode}): {self.log_tail()}")

    def start(self) -> None:
        run_tool(["runc", "start", self.name])

    def state(self) -> dict | None:
        result = subprocess.run(["runc", "state", self.name], capture_output=True, text=True)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def stop(self, timeout: float = 30) -> str | None:
        """SIGTERM, as a kubelet stops a pod; the status it ended in ("stopped" is clean)."""
        subprocess.run(["runc", "kill", self.name, "TERM"], capture_output=True)
        deadline = time.monotonic() + timeout
        state = self.state()
        while state and state.get("status") != "stopped" and time.monotonic() < deadline:
            time.sleep(0.2)
            state = self.state()
        subprocess.run(["runc", "delete", "--force", self.name], capture_output=True)
        return state.get("status") if state else None

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def tree_state(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under `root` with its mode, owner, size and modification time."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            found[os.path.relpath(p, root)] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns)
    return found
