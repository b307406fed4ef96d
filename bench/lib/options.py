"""The options of bench/converge.py, one field per command-line option."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Options:
    n: int
    mix: str
    namespaces: int
    idle: float
    restart: float
    changes: int
    timeout: float
    keep: bool
    operator_args: list[str]
    json_path: Path | None
    create_method: str
    create_workers: int
    change_workers: int
    seed: int
    py_spy: Path | None
    py_spy_rate: int
    py_spy_mode: str
    workdir: Path | None
    # The cloud: instant (moto as it is) or aws-like (provisioner_dev/awslike.py in front).
    cloud_profile: str = "instant"
    # CloudAccounts to spread the namespaces over (0: the operator's own account only).
    accounts: int = 0
    time_scale: str | None = None
    duration: list[str] = field(default_factory=list)
    throttle: list[str] = field(default_factory=list)
    # Operator processes, sharded (--sharding=on) when more than one or `sharding`.
    replicas: int = 1
    sharding: bool = False
