"""Sharding: replicas split the resources, and hand them over safely when one dies or joins.

Three operators run with `--sharding=on` in a namespace of the test's own, each with its own
shard name and its own user agent (`AWS_SDK_UA_APP_ID`), so that moto's recording of every
request tells which replica made each call. What is checked, as a platform engineer would:
the shard labels on the resources (`kubectl get -L`), the replicas' Leases, the cloud through
boto3, and the recorded calls: for every resource, the replicas that called the cloud for it
take turns (A's calls, then B's), never interleave.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from bench.lib.recording import replica_turns
from tests.conftest import on_moto_only
from tests.helpers import apply, manifests, merge_patch, wait_for, wait_gone, wait_ready

pytestmark = [pytest.mark.e2e, on_moto_only]

SHARD = "sharding.cloud.provisioner.dev/shard"
DRAIN = "sharding.cloud.provisioner.dev/drain"
LEASE = 6  # seconds: a killed replica's resources move within about this
QUEUES = 30


def start_shard(start_operator, namespace: str, name: str, ring: str):
    return start_operator(
        args=["--sharding=on", f"--shard-name={name}", f"--shard-lease-seconds={LEASE}"],
        env={
            "PROVISIONER_NAMESPACE": namespace,
            "PROVISIONER_SHARD_RING": ring,
            "AWS_SDK_UA_APP_ID": name,
        },
    )


def owners(kube, namespace: str) -> dict[str, str]:
    """queue name -> its shard label ("" when unassigned or being moved)."""
    items = json.loads(kube.kubectl("get", "queues", "-n", namespace, "-o", "json").stdout)
    result = {}
    for item in items["items"]:
        labels = item["metadata"].get("labels") or {}
        result[item["metadata"]["name"]] = "" if DRAIN in labels else labels.get(SHARD, "")
    return result


def recorded_lines(kube) -> int:
    return len(kube.moto.record_to.read_text(errors="replace").splitlines())


def test_replicas_split_resources_and_hand_them_over(kube, aws, own_namespace, start_operator):
    ring = own_namespace
    replicas = {n: start_shard(start_operator, own_namespace, n, ring) for n in ("a", "b", "c")}
    names = [f"q{i:02d}" for i in range(QUEUES)]
    apply(
        kube,
        own_namespace,
        manifests([("Queue", n, "{visibilityTimeoutSeconds: 40}") for n in names]),
    )
    urls = {
        n: wait_ready(kube, "queue", own_namespace, n, timeout=180)["status"]["queueUrl"]
        for n in names
    }
    cloud = {n: u.rstrip("/").rpartition("/")[2] for n, u in urls.items()}

    # Spread: every replica holds some (128 points each on the ring: 30 land 4..18 apiece).
    spread = Counter(owners(kube, own_namespace).values())
    assert set(spread) == {"a", "b", "c"}, spread
    assert min(spread.values()) >= 3, spread
    # Each resource's cloud calls so far: by the replica that holds it last (one that joined
    # while they were being created may have taken some over, after their first owner).
    held = owners(kube, own_namespace)
    for name, order in replica_turns(kube.moto.record_to, list(cloud.values())).items():
        queue = next(n for n, c in cloud.items() if c == name)
        assert order and order[-1] == held[queue], (queue, order)
        assert len(order) == len(set(order)), (queue, order)
    leases = json.loads(kube.kubectl("get", "leases", "-n", own_namespace, "-o", "json").stdout)
    holders = {i["spec"].get("holderIdentity") for i in leases["items"]}
    assert {"a", "b", "c"} <= holders, holders

    # A replica dies without a word: its resources move to the others within the Lease time.
    mark = recorded_lines(kube)
    lost = [n for n, owner in held.items() if owner == "c"]
    replicas["c"].stop(kill=True)
    killed = time.monotonic()
    wait_for(
        lambda: all(owners(kube, own_namespace)[n] in ("a", "b") for n in lost),
        timeout=60,
        what="the dead replica's queues to move",
    )
    moved_after = time.monotonic() - killed
    # The Lease's duration, then a sharder round (1 s) and a kubectl poll: a busy machine's
    # slack on top; never before the Lease could have expired.
    assert moved_after <= LEASE + 20, moved_after
    # Moved resources are acted on by their new owner: a change reaches the cloud.
    target = lost[0]
    merge_patch(kube, "queue", own_namespace, target, '{"spec":{"visibilityTimeoutSeconds":41}}')
    wait_ready(kube, "queue", own_namespace, target, timeout=60, generation=2)
    attrs = aws.sqs.get_queue_attributes(
        QueueUrl=urls[target], AttributeNames=["VisibilityTimeout"]
    )
    assert attrs["Attributes"]["VisibilityTimeout"] == "41"

    # A replica joins: it takes some over, drained from their live owners first.
    start_shard(start_operator, own_namespace, "d", ring)
    wait_for(
        lambda: (
            Counter(owners(kube, own_namespace).values()).get("d", 0) >= 3
            and "" not in owners(kube, own_namespace).values()
        ),
        timeout=90,
        what="the new replica to take over some queues",
    )
    final = owners(kube, own_namespace)
    # One it took that was not changed above (that one is at generation 2 already).
    taken = [n for n, owner in final.items() if owner == "d" and n != target]
    merge_patch(kube, "queue", own_namespace, taken[0], '{"spec":{"visibilityTimeoutSeconds":42}}')
    wait_ready(kube, "queue", own_namespace, taken[0], timeout=60, generation=2)
    attrs = aws.sqs.get_queue_attributes(
        QueueUrl=urls[taken[0]], AttributeNames=["VisibilityTimeout"]
    )
    assert attrs["Attributes"]["VisibilityTimeout"] == "42"

    # A replica that stops gracefully leaves the ring at once (its Lease deleted), and the
    # others take its queues without waiting for it to expire.
    # SIGTERM, and time for a busy machine to finish (a SIGKILL would leave the Lease).
    replicas["a"].stop(timeout=90)
    lease = kube.kubectl(
        "get", "lease", f"{ring}-shard-a", "-n", own_namespace, "-o", "name", check=False
    )
    assert lease.returncode != 0 and "NotFound" in lease.stderr, lease.stdout
    wait_for(
        lambda: (
            "a" not in owners(kube, own_namespace).values()
            and "" not in owners(kube, own_namespace).values()
        ),
        timeout=60,
        what="the stopped replica's queues to move",
    )

    # Everything deleted: by whichever replica holds each; nothing left in the cloud.
    kube.kubectl("delete", "queues", "--all", "-n", own_namespace, "--wait=false")
    for name in names:
        wait_gone(kube, "queue", own_namespace, name, timeout=120)
    left = aws.sqs.list_queues(QueueNamePrefix="").get("QueueUrls", [])
    assert not [u for u in left if u.rstrip("/").rpartition("/")[2] in cloud.values()]

    # From just before the kill, per resource: the replicas took turns, none came back to act
    # again after another had started; c (acting until the SIGKILL lands) only first, before
    # any other; a before it stopped, so every deletion was made by b or d.
    for name, order in replica_turns(kube.moto.record_to, list(cloud.values()), mark).items():
        assert len(order) == len(set(order)), (name, order)
        assert "c" not in order[1:], (name, order)
        assert order and order[-1] in ("b", "d"), (name, order)  # deleted by those left
