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
from bench.lib.soak_operators import CLUSTER_ID, Operators, log  # noqa: E402
from bench.lib.soak_table import Soaked, print_table  # noqa: E402
from bench.lib.synced import SyncedWatch  # noqa: E402
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
from provisioner_dev.kubectl import run_kubectl  # noqa: E402
from provisioner_dev.kubejson import KubeJson  # noqa: E402
from provisioner_dev.launch import Stack  # noqa: E402
from provisioner_dev.samples import SAMPLES  # noqa: E402

# Every registered kind, with its sample spec (deleted without a final snapshot), the change
# made to each, and the manifests the API server must refuse.
KINDS = {
    k.kind: (k.plural, json.dumps({**SAMPLES[k.kind].spec, "deletionPolicy": "Delete"}))
    for k in REGISTERED
}
UPDATES = {k: json.dumps(SAMPLES[k].change(3)[0]) for k in KINDS}
INVALID = [(k, spec) for k in KINDS for spec in SAMPLES[k].invalid]
# What must be 0 at the end (figures).
MUST_BE_NONE = (
    "duplicates",
    "leaks",
    "stuck terminating",
    "secrets missing",
    "created for invalid",
    "acted on by two at once",
)


def is_ready(item: dict) -> bool:
    return (ready_condition(item) or {}).get("status") == "True"


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
        self.figures: Counter[str] = Counter()
        self.operators = Operators(
            self.stack, args, self.rng, self.figures, self.busy_shards, self.dir
        )
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

    def busy_shards(self) -> set[str]:
        """The shard names that own a Ready resource."""
        return {
            str((item["metadata"].get("labels") or {}).get(SHARD_LABEL))
            for item in self.listing()
            if is_ready(item)
        }

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
                with self.operators.lock:  # no operator restart may take the port while it is free
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
        synced = self.start()
        killer = threading.Thread(target=self.operators.killer, daemon=True)
        killer.start()
        log(f"creating {self.args.n} resources in {self.args.namespaces} namespaces")
        self.create()
        t_ready = self.wait(lambda: self.not_ready(1), "all Ready")
        cloud_names = self.count_created()

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
        self.operators.stop_killing.set()
        killer.join(timeout=180)
        self.count_left(cloud_names)
        assert self.stack.proxy is not None
        stats = self.stack.proxy.stats()
        synced.stop()
        seen = synced.summary()
        cloud = self.stack.awslike.stats() if self.stack.awslike is not None else None
        times = (t_ready, t_updated, t_deleted, time.monotonic() - started)
        print_table(self.soaked(stats, seen, cloud, *times))
        return self.verdict(seen, times)

    def start(self) -> SyncedWatch:
        """The stack, the accounts, the operator(s), and the watch of every Synced=False."""
        self.stack.start()
        self.api = KubeJson(self.stack.kubeconfig, transient_seconds=60)
        self.cloud = DevCloud(self.stack.cloud.url)
        self.create_accounts()
        for _ in range(max(1, self.args.replicas)):
            self.operators.start_replica()
        namespaces = {f"soak-{i}" for i in range(self.args.namespaces)}
        synced = self.synced = SyncedWatch(
            KubeJson(self.stack.kubeconfig, transient_seconds=60),
            [plural for plural, _ in KINDS.values()],
            wanted=lambda namespace, name: namespace in namespaces,
        )
        synced.phase = "create"
        synced.start().wait_listed()
        return synced

    def count_created(self) -> list[str]:
        """At all Ready: duplicates and missing ones in the cloud, missing Secrets, what was
        made of invalid manifests. The cloud names of the resources."""
        assert self.api is not None
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
        return cloud_names

    def count_left(self, cloud_names: list[str]) -> None:
        """After the deletes: CRs stuck, cloud resources left, and (sharded) the handovers."""
        self.figures["stuck terminating"] = len(self.listing())
        self.figures["leaks"] = sum(self.owners().values())
        if self.args.replicas and self.stack.recording is not None:
            turns = replica_turns(self.stack.recording, cloud_names)
            self.figures["handovers"] = sum(max(0, len(t) - 1) for t in turns.values())
            self.figures["acted on by two at once"] = len(overlapping(turns))

    def soaked(
        self,
        stats: dict,
        synced: dict,
        cloud: dict | None,
        t_ready: float,
        t_updated: float,
        t_deleted: float,
        total: float,
    ) -> Soaked:
        return Soaked(
            args=self.args,
            kinds=len(KINDS),
            accounts=len(self.account_ids),
            kills=self.operators.kills,
            generation=self.operators.generation,
            figures=self.figures,
            stats=stats,
            synced=synced,
            cloud=cloud,
            t_ready=t_ready,
            t_updated=t_updated,
            t_deleted=t_deleted,
            total=total,
        )

    def verdict(self, seen: dict, times: tuple[float, float, float, float]) -> int:
        """1 (and why, in the log) if anything must-be-none was seen or a phase timed out."""
        bad = [key for key in MUST_BE_NONE if self.figures[key] > 0]
        if seen["throttling"]:
            bad.append("Synced=False from throttling")
        if self.figures["invalid refused"] != self.figures["invalid applied"]:
            bad.append("invalid accepted")
        if min(times[:3]) < 0:
            bad.append("timeout")
        if bad:
            log(f"FAILED: {', '.join(bad)} (data kept in {self.dir})")
            return 1
        return 0

    def close(self) -> None:
        self.operators.stop_killing.set()
        if self.synced is not None:
            self.synced.stop()
        with self.operators.lock:
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
