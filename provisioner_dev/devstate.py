"""What `.dev/state.json` records of a dev environment, and whether it still runs.

`state.json` names every process `dev up` started (pid, start time, part it plays, log), so
that a dead operator (restart it, keep the rest) can be told from a dead control plane or
moto (start over), and a reused pid is never mistaken for ours.
"""

from __future__ import annotations

import json
from pathlib import Path

from provisioner_dev.controlplane import ControlPlaneState, healthy
from provisioner_dev.kubectl import cluster_answers
from provisioner_dev.processes import StartError, same_alive, start_time, wait_until
from provisioner_dev.services import http_up

# The processes of a dev environment, by the part they play. The control plane and moto
# hold its data (CRs, Secrets, cloud resources): when one of them dies that data is gone and
# `dev up` starts over. The operator holds none: `dev up` restarts it alone.
CONTROLLER_MANAGER = "kube-controller-manager"
CONTROL_PLANE = ("etcd", "kube-apiserver", CONTROLLER_MANAGER)
MOTO = "moto"
# The aws-like profile's proxy in front of moto: it holds the cloud's timing (what is still
# `creating`, which names are held), so it counts like moto.
PROXY = "awslike-proxy"
OPERATOR = "operator"
# `dev up --observability`'s backends (provisioner_dev/observability.py): like the operator,
# they hold none of the environment's data, and a dead one is started again alone.
OBSERVABILITY = "observability"
STATE_VERSION = 2


def _part(name: str) -> str:
    return "control plane" if name in CONTROL_PLANE else name


def record(name: str, pid: int, log: Path, part: str | None = None) -> dict:
    """What `state.json` keeps of a process `dev up` started."""
    return {
        "pid": pid,
        "start_time": start_time(pid),
        "part": part or _part(name),
        "log": str(log),
    }


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class DevState:
    """`state.json` in `dev_dir`: read, written, and checked against what runs."""

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir
        self.state_file = dev_dir / "state.json"

    def load(self) -> dict | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        if "processes" not in state:  # written before processes were recorded by part
            state["processes"] = {
                name: {"pid": pid, "start_time": None, "part": _part(name)}
                for name, pid in state.get("pids", {}).items()
            }
            state["with_operator"] = OPERATOR in state["processes"]
        return state

    def save(self, state: dict) -> None:
        state["pids"] = {name: proc["pid"] for name, proc in state["processes"].items()}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    @staticmethod
    def is_alive(proc: dict) -> bool:
        """Whether a recorded process still runs, and is the one that was recorded."""
        return same_alive(proc["pid"], proc.get("start_time"))

    def dead(self, state: dict, wait: float = 0.0) -> list[str]:
        """What is wrong with the control plane and moto: empty when both run and answer.

        A live API server or moto that does not answer is given up to `wait` seconds.
        """
        processes = state.get("processes", {})
        if state.get("external_cluster"):
            return self._dead_external(state, wait)
        # A control plane from envtest's binaries runs without a controller-manager.
        needed = [n for n in CONTROL_PLANE if n != CONTROLLER_MANAGER or state.get("gc", True)]
        missing = [name for name in (*needed, MOTO) if name not in processes]
        if missing or "controlplane" not in state or "moto_url" not in state:
            return [f"{self.state_file} is incomplete ({_join(missing or ['URLs'])} missing)"]
        if gone := self._dead_holders(processes):
            return gone
        cp = ControlPlaneState(**state["controlplane"])
        probes = {
            "kube-apiserver": lambda: healthy(cp),
            MOTO: lambda: http_up(f"{state['moto_url']}/moto-api/"),
        }
        problems = []
        for name, probe in probes.items():
            try:
                wait_until(probe, timeout=wait, what=name)
            except StartError:
                problems.append(f"{name} does not answer")
        return problems

    def _dead_holders(self, processes: dict) -> list[str]:
        """The processes that hold data (all but the operator and the observability backends)
        that are dead, in one line."""
        gone = [
            name
            for name, proc in processes.items()
            if proc["part"] not in (OPERATOR, OBSERVABILITY) and not self.is_alive(proc)
        ]
        return [f"{_join(gone)} {'is' if len(gone) == 1 else 'are'} dead"] if gone else []

    def _dead_external(self, state: dict, wait: float) -> list[str]:
        """An existing cluster (`dev up --kubeconfig`): it answers, and moto runs."""
        processes = state.get("processes", {})
        if MOTO not in processes or "moto_url" not in state:
            return [f"{self.state_file} is incomplete (moto missing)"]
        if gone := self._dead_holders(processes):
            return gone
        problems = []
        why = cluster_answers(state["kubeconfig"])
        if why:
            problems.append(f"the cluster in {state['kubeconfig']} does not answer ({why})")
        try:
            wait_until(lambda: http_up(f"{state['moto_url']}/moto-api/"), timeout=wait, what=MOTO)
        except StartError:
            problems.append(f"{MOTO} does not answer")
        return problems

    def operator(self, state: dict) -> str:
        """'running', 'dead', or 'not started' (--no-operator)."""
        proc = state["processes"].get(OPERATOR)
        if proc is None:
            return "not started"
        return "running" if self.is_alive(proc) else "dead"

    def dead_backends(self, state: dict) -> list[str]:
        """The observability backends recorded in `state` whose process is not running."""
        processes = state.get("processes", {})
        return [
            name
            for name in state.get(OBSERVABILITY) or {}
            if name not in processes or not self.is_alive(processes[name])
        ]

    def running(self, state: dict) -> bool:
        return not self.dead(state)
