"""Soak: N resources through create, update and delete while everything goes wrong.

The operator is SIGKILLed at random moments and restarted, a fault proxy in front of
moto answers a share of AWS calls with throttling, 5xx, slow or dropped connections
(some after the cloud acted), the API server is restarted once, and invalid manifests
are applied in between. At the end one table; exit 1 if anything was duplicated,
leaked, stuck in Terminating, or left without its Secret.

    .venv/bin/python bench/soak.py --n 200 --kills 20 --fault-rate 0.3 --invalid 50
    .venv/bin/python bench/soak.py --cloud-profile aws-like --n 60

With `--cloud-profile aws-like` the aws-like proxy (AWS's slow states, name holds and
throttling) sits behind the fault proxy: operator -> fault proxy -> aws-like proxy -> moto, so
that a call the fault proxy loses after the cloud acted was seen by the aws-like cloud too.
Every Synced=False a resource shows is seen with a WATCH and counted by class.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lib.recording import overlapping, replica_turns  # noqa: E402
from bench.lib.synced import SyncedWatch, describe  # noqa: E402
from bench.lib.workload import ready_condition  # noqa: E402
from provisioner import API_VERSION  # noqa: E402
from provisioner.kinds.registry import KINDS as REGISTERED  # noqa: E402
from provisioner.runtime.sharding import SHARD_LABEL  # noqa: E402
from provisioner_dev.cloud import (  # noqa: E402
    DevCloud,
    by_owner,
    cloud_account,
    create_role,
    in_account,
    inventory,
)
from provisioner_dev.cloudprofile import (  # noqa: E402
    PROFILES,
    CloudProfile,
    ProfileError,
    add_profile_arguments,
    requested_profile,
)
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402
from provisioner_dev.samples import SAMPLES  # noqa: E402
from provisioner_dev.stack import OperatorProcess, run_kubectl  # noqa: E402

CLUSTER_ID = "soak"
# Every registered kind, with its sample spec (deleted without a final snapshot), the change
# made to each, and the manifests the API server must refuse.
KINDS = {
    k.kind: (k.plural, json.dumps({**SAMPLES[k.kind].spec, "deletionPolicy": "Delete"}))
    for k in REGISTERED
}
UPDATES = {k: json.dumps(SAMPLES[k].change(3)[0]) for k in KINDS}
INVALID = [(k, spec) for k in KINDS for spec in SAMPLES[k].invalid]


def shard_name(op: OperatorProcess) -> str | None:
    return next((a.split("=", 1)[1] for a in op.extra_args if a.startswith("--shard-name=")), None)


def is_ready(item: dict) -> bool:
    return (ready_condition(item) or {}).get("status") == "True"


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Soak:
    def __init__(self, args: argparse.Namespace, cloud: CloudProfile | None = None) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir = Path(tempfile.mkdtemp(prefix="provisioner-soak-"))
        self.stack = Stack(
            dir=self.dir,
            fault_rate=args.fault_rate,
            fault_seed=args.seed,
            # Sharded: moto's recording tells which replica made each call (user agent).
            record=bool(args.replicas),
            cloud_profile=cloud,
            cloud_seed=args.seed,
        )
        self.api: KubeJson | None = None
        self.synced: SyncedWatch | None = None
        self.cloud: DevCloud | None = None
        self.lock = threading.Lock()
        self.kills = 0
        self.generation = 0  # shard names handed out (--replicas)
        self.stop_killing = threading.Event()
        self.figures: Counter[str] = Counter()
        self.names: list[tuple[str, str, str]] = []  # (kind, namespace, name)
        # --accounts: the CloudAccounts' ids, and a view of each account's cloud.
        self.account_ids = [f"{100000000001 + i}" for i in range(args.accounts)]
        self.account_clouds: list[DevCloud] = []

    # -- plumbing -----------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        for attempt in range(30):
            result = run_kubectl(self.stack.kubeconfig, *args, input=input)
            transient = (
                "connection refused" in result.stderr or "ServiceUnavailable" in result.stderr
            )
            if result.returncode == 0 or not transient:
                break
            time.sleep(min(2.0, 0.2 * (attempt + 1)))  # the API server is being restarted
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {result.stderr.strip()}")
        return result

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
                    busy = self.busy_shards()
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
        log_file = self.dir / f"operator-{name}.log"
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

    def busy_shards(self) -> set[str]:
        """The shard names that own a Ready resource."""
        return {
            str((item["metadata"].get("labels") or {}).get(SHARD_LABEL))
            for item in self.listing()
            if is_ready(item)
        }

    def revive(self) -> None:
        """Start again every operator whose process has exited by itself."""
        for op in self.stack.operators:
            if op.proc is not None and op.proc.poll() is not None:
                log(f"an operator exited by itself ({op.proc.returncode}): starting it again")
                self.figures["operator exits"] += 1
                op.proc = None
                self.start_replica(op)

    def owners(self) -> Counter[str]:
        """owner-uid -> number of cloud resources carrying it (our cluster only)."""
        assert self.cloud is not None
        return by_owner(
            r
            for cloud in (self.cloud, *self.account_clouds)
            for r in inventory(cloud, cluster_id=CLUSTER_ID)
        )

    def listing(self) -> list[dict]:
        assert self.api is not None
        return [
            item
            for plural, _ in KINDS.values()
            for item in self.api.list_items(f"/apis/{API_VERSION}/{plural}")
        ]

    def create_accounts(self) -> None:
        """--accounts: a role in each account and a CloudAccount for every K-th namespace."""
        for i, account in enumerate(self.account_ids):
            role = create_role(self.stack.cloud.url, account, "provisioner")
            self.account_clouds.append(in_account(self.stack.cloud.url, account, "soak"))
            body = cloud_account(f"soak-acc-{i}", role, {"soak-account": f"acc-{i}"})
            self.kubectl("apply", "-f", "-", input=json.dumps(body))

    # -- phases -------------------------------------------------------------------

    def create(self) -> None:
        n, ns_count = self.args.n, self.args.namespaces
        kinds = list(KINDS)
        for i in range(ns_count):
            self.kubectl("create", "namespace", f"soak-{i}")
            if self.account_ids:
                a = i % len(self.account_ids)
                self.kubectl("label", "namespace", f"soak-{i}", f"soak-account=acc-{a}")
                self.kubectl(
                    "annotate",
                    "namespace",
                    f"soak-{i}",
                    f"{API_VERSION.split('/')[0]}/default-account=soak-acc-{a}",
                )
        self.names = [(kinds[i % len(kinds)], f"soak-{i % ns_count}", f"r{i}") for i in range(n)]
        invalid = [INVALID[i % len(INVALID)] for i in range(self.args.invalid)]
        batches = [self.names[i : i + 20] for i in range(0, n, 20)]
        per_batch = max(1, len(invalid) // max(1, len(batches)))
        restarted = False
        for b, batch in enumerate(batches):
            docs = "".join(
                f"---\napiVersion: {API_VERSION}\nkind: {kind}\nmetadata:\n  name: {name}\n"
                f"  namespace: {ns}\nspec: {KINDS[kind][1]}\n"
                for kind, ns, name in batch
            )
            self.kubectl("apply", "-f", "-", input=docs)
            for kind, spec in invalid[b * per_batch : (b + 1) * per_batch] + (
                invalid[len(batches) * per_batch :] if b == len(batches) - 1 else []
            ):
                self.apply_invalid(kind, spec)
            if not restarted and b >= len(batches) // 2:
                log("restarting kube-apiserver")
                with self.lock:  # no operator restart may take the port while it is free
                    self.stack.controlplane.restart_apiserver()
                restarted = True
                self.figures["apiserver restarts"] += 1

    def apply_invalid(self, kind: str, spec: str) -> None:
        name = f"bad-{self.figures['invalid applied']}"
        doc = (
            f"apiVersion: {API_VERSION}\nkind: {kind}\n"
            f"metadata:\n  name: {name}\n  namespace: soak-0\nspec: {spec}\n"
        )
        result = self.kubectl("apply", "-f", "-", input=doc, check=False)
        self.figures["invalid applied"] += 1
        if result.returncode != 0 and ("Invalid" in result.stderr or "invalid" in result.stderr):
            self.figures["invalid refused"] += 1

    def wait(self, done, what: str) -> float:
        started = time.monotonic()
        deadline = started + self.args.timeout
        while time.monotonic() < deadline:
            remaining = done()
            if remaining == 0:
                return time.monotonic() - started
            time.sleep(1.0)
        log(f"timed out waiting for {what}: {remaining} left")
        return -1.0

    def not_ready(self, generation: int = 1) -> int:
        left = 0
        for item in self.listing():
            observed = (item.get("status") or {}).get("observedGeneration", 0)
            if not is_ready(item) or observed < generation:
                left += 1
        return left + max(0, len(self.names) - len(self.listing()))

    def run(self) -> int:
        started = time.monotonic()
        self.stack.start()
        self.api = KubeJson(self.stack.kubeconfig, transient_seconds=60)
        self.cloud = DevCloud(self.stack.cloud.url)
        self.create_accounts()
        for _ in range(max(1, self.args.replicas)):
            self.start_replica()
        namespaces = {f"soak-{i}" for i in range(self.args.namespaces)}
        synced = self.synced = SyncedWatch(
            KubeJson(self.stack.kubeconfig, transient_seconds=60),
            [plural for plural, _ in KINDS.values()],
            wanted=lambda namespace, name: namespace in namespaces,
        )
        synced.phase = "create"
        synced.start().wait_listed()
        killer = threading.Thread(target=self.killer, daemon=True)
        killer.start()
        log(f"creating {self.args.n} resources in {self.args.namespaces} namespaces")
        self.create()
        t_ready = self.wait(lambda: self.not_ready(1), "all Ready")
        owners = self.owners()
        cloud_names = [
            str(item["status"]["externalName"])
            for item in self.listing()
            if (item.get("status") or {}).get("externalName")
        ]
        uids = {item["metadata"]["uid"] for item in self.listing()}
        self.figures["duplicates"] = sum(n - 1 for uid, n in owners.items() if n > 1)
        self.figures["missing cloud resources"] = len(uids - set(owners))
        self.figures["in cloud accounts"] = sum(
            len(inventory(c, cluster_id=CLUSTER_ID)) for c in self.account_clouds
        )
        self.figures["secrets missing"] = sum(
            1
            for item in self.listing()
            if self.api.get(
                f"/api/v1/namespaces/{item['metadata']['namespace']}"
                f"/secrets/{item['metadata']['name']}-connection"
            )
            is None
        )
        created_for_invalid = sum(
            1 for item in self.listing() if item["metadata"]["name"].startswith("bad-")
        )
        self.figures["created for invalid"] = created_for_invalid

        synced.phase = "update"
        log("updating every resource")
        for kind, ns, name in self.names:
            self.kubectl(
                "patch", KINDS[kind][0], name, "-n", ns, "--type=merge", "-p", UPDATES[kind]
            )
        t_updated = self.wait(lambda: self.not_ready(2), "all updates reconciled")

        synced.phase = "delete"
        log("deleting every resource")
        for i in range(self.args.namespaces):
            self.kubectl(
                "delete",
                ",".join(p for p, _ in KINDS.values()),
                "--all",
                "-n",
                f"soak-{i}",
                "--wait=false",
            )
        t_deleted = self.wait(lambda: len(self.listing()), "all deleted")
        self.stop_killing.set()
        killer.join(timeout=180)
        self.figures["stuck terminating"] = len(self.listing())
        self.figures["leaks"] = sum(self.owners().values())
        if self.args.replicas and self.stack.recording is not None:
            turns = replica_turns(self.stack.recording, cloud_names)
            self.figures["handovers"] = sum(max(0, len(t) - 1) for t in turns.values())
            self.figures["acted on by two at once"] = len(overlapping(turns))
        assert self.stack.proxy is not None
        stats = self.stack.proxy.stats()
        synced.stop()
        seen = synced.summary()
        cloud = self.stack.awslike.stats() if self.stack.awslike is not None else None
        self.print_table(
            stats, seen, cloud, t_ready, t_updated, t_deleted, time.monotonic() - started
        )
        bad = [
            key
            for key in (
                "duplicates",
                "leaks",
                "stuck terminating",
                "secrets missing",
                "created for invalid",
                "acted on by two at once",
            )
            if self.figures[key] > 0
        ]
        if seen["throttling"]:
            bad.append("Synced=False from throttling")
        if self.figures["invalid refused"] != self.figures["invalid applied"]:
            bad.append("invalid accepted")
        if min(t_ready, t_updated, t_deleted) < 0:
            bad.append("timeout")
        if bad:
            log(f"FAILED: {', '.join(bad)} (data kept in {self.dir})")
            return 1
        return 0

    def print_table(
        self,
        stats: dict,
        synced: dict,
        cloud: dict | None,
        t_ready: float,
        t_updated: float,
        t_deleted: float,
        total: float,
    ) -> None:
        n = self.args.n
        profile = "instant (moto as it is)"
        if cloud is not None:
            profile = f"{cloud['profile']}, time scale {cloud['time_scale']:g}"
        rows = [
            ("CRs", f"{n} ({self.args.namespaces} namespaces, even mix of {len(KINDS)} kinds)"),
            ("AWS accounts", str(len(self.account_ids) or "the operator's own")),
            ("cloud profile", profile),
            (
                "operators",
                f"{self.args.replicas} sharded ({self.generation} shard names over the run)"
                if self.args.replicas
                else "1",
            ),
            ("operator kills (SIGKILL)", str(self.kills)),
            ("operator exits by themselves", str(self.figures["operator exits"])),
            ("API-server restarts", str(self.figures["apiserver restarts"])),
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
                        + "".join(
                            f"; {k} {v}" for k, v in sorted(cloud["refusals_by_action"].items())
                        ),
                    )
                ]
            ),
            ("Synced=False seen (WATCH)", describe(synced)),
            (
                "invalid manifests refused",
                f"{self.figures['invalid refused']} of {self.figures['invalid applied']}",
            ),
            ("created for invalid manifests", str(self.figures["created for invalid"])),
            *(
                [
                    (
                        "handovers (AWS calls by a new replica)",
                        str(self.figures["handovers"]),
                    ),
                    (
                        "resources acted on by two replicas at once",
                        str(self.figures["acted on by two at once"]),
                    ),
                ]
                if self.args.replicas
                else []
            ),
            ("duplicates", str(self.figures["duplicates"])),
            ("leaks", str(self.figures["leaks"])),
            ("stuck Terminating", str(self.figures["stuck terminating"])),
            ("Secrets missing", str(self.figures["secrets missing"])),
            ("time to all Ready", f"{t_ready:.1f} s"),
            ("time to all updated", f"{t_updated:.1f} s"),
            ("time to all deleted", f"{t_deleted:.1f} s"),
            ("time taken", f"{total:.1f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        print()
        for key, value in rows:
            print(f"{key.ljust(width)}  {value}")
        if self.args.json:
            Path(self.args.json).write_text(
                json.dumps(
                    {
                        "kills": self.kills,
                        "aws": stats,
                        "cloud_profile": cloud,
                        "synced_false": synced,
                        **self.figures,
                        "ready_s": t_ready,
                        "updated_s": t_updated,
                        "deleted_s": t_deleted,
                        "total_s": total,
                    },
                    indent=2,
                )
            )

    def close(self) -> None:
        self.stop_killing.set()
        if self.synced is not None:
            self.synced.stop()
        with self.lock:
            self.stack.stop()
        if not self.args.keep:
            self.stack.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--namespaces", type=int, default=5)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument(
        "--kill-min", type=float, default=2.0, help="seconds between kills, at least"
    )
    parser.add_argument(
        "--kill-max", type=float, default=8.0, help="seconds between kills, at most"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="sharded operators (--sharding=on; a killed one comes back under a new shard "
        "name); 0: one operator, not sharded (default)",
    )
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--invalid", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=900.0, help="per phase")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--accounts",
        type=int,
        default=0,
        help="spread the namespaces over this many CloudAccounts (default 0: the operator's own)",
    )
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--cloud-profile",
        default="instant",
        help=f"{' or '.join(PROFILES)}: moto as it is (default), or behind the aws-like proxy",
    )
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cloud = requested_profile(args.cloud_profile, args.time_scale, args.duration, args.throttle)
    except ProfileError as exc:
        raise SystemExit(f"bench/soak.py: {exc}") from None
    soak = Soak(args, cloud)
    try:
        return soak.run()
    finally:
        soak.close()


if __name__ == "__main__":
    raise SystemExit(main())
