"""The soak's operators: started, SIGKILLed at random moments and started again, as a
Deployment's pods would be; sharded (--replicas), each comes back under a new shard name."""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from provisioner_dev.launch import Stack
from provisioner_dev.services import OperatorProcess

CLUSTER_ID = "soak"


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def shard_name(op: OperatorProcess) -> str | None:
    return next((a.split("=", 1)[1] for a in op.extra_args if a.startswith("--shard-name=")), None)


class Operators:
    """The operator processes of the stack, and the killer that SIGKILLs them.

    `busy`: the shard names that own work (a Ready resource) right now. `lock`: held while an
    operator is killed and started again, and by whoever must not race that (restarting the
    API server, stopping the stack).
    """

    def __init__(
        self,
        stack: Stack,
        args: argparse.Namespace,
        rng: random.Random,
        figures: Counter[str],
        busy: Callable[[], set[str]],
        log_dir: Path,
    ) -> None:
        self.stack = stack
        self.args = args
        self.rng = rng
        self.figures = figures
        self.busy = busy
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.kills = 0
        self.generation = 0  # shard names handed out (--replicas)
        self.stop_killing = threading.Event()

    def killer(self) -> None:
        """SIGKILL an operator at random moments and bring it back. Sharded (--replicas), the
        one that comes back has a new shard name, as a Deployment's new pod does: every kill
        is a replica leaving without a word and another joining; and the one killed is one
        holding work (a Ready resource labelled with its name, which it has called the cloud
        for), so that every kill hands something over. An operator that exited by
        itself (a sharded one whose Lease could not be renewed while the API server was
        down) is started again, as the kubelet would."""
        while not self.stop_killing.wait(self.rng.uniform(self.args.kill_min, self.args.kill_max)):
            with self.lock:
                self.revive()
                if self.kills >= self.args.kills:
                    continue
                running = [op for op in self.stack.operators if op.proc is not None]
                if self.args.replicas:
                    busy = self.busy()
                    running = [op for op in running if shard_name(op) in busy]
                if not running:
                    continue
                op = self.rng.choice(running)
                op.stop(kill=True)
                self.kills += 1
                log(f"killed an operator ({self.kills}/{self.args.kills})")
                self.start_replica(op)

    def start_replica(self, op: OperatorProcess | None = None) -> None:
        """Start `op` again (a new shard name when sharded), or a new operator."""
        if not self.args.replicas:
            if op is None:
                self.stack.start_operator(
                    args=["--resync-seconds=30"], cluster_id=CLUSTER_ID, timeout=120
                )
            else:
                op.start(timeout=120)
            return
        self.generation += 1
        name = f"r{self.generation}"
        args = ["--resync-seconds=30", "--sharding=on", f"--shard-name={name}"]
        env = {"PROVISIONER_NAMESPACE": "default", "AWS_SDK_UA_APP_ID": name}
        log_file = self.log_dir / f"operator-{name}.log"
        if op is None:
            self.stack.start_operator(
                args=args, env=env, cluster_id=CLUSTER_ID, timeout=120, log=log_file
            )
        else:
            op.extra_args = [
                *(a for a in op.extra_args if not a.startswith("--shard-name=")),
                f"--shard-name={name}",
            ]
            op.extra_env = {**op.extra_env, **env}
            op.log = log_file
            op.start(timeout=120)

    def revive(self) -> None:
        """Start again every operator whose process has exited by itself."""
        for op in self.stack.operators:
            if op.proc is not None and op.proc.poll() is not None:
                log(f"an operator exited by itself ({op.proc.returncode}): starting it again")
                self.figures["operator exits"] += 1
                op.proc = None
                self.start_replica(op)
