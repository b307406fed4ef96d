"""A restart re-observes resources at rest over the resync period, not all at once.

After a restart kopf resumes every resource. One at rest (Ready and Synced for its current
generation, nothing requested, not paused, not being deleted) is not observed then: its
next look at the cloud is its resync, spread over the period from a tenth of it on. What
changed while the operator was down is handled at once: a spec change, a deletion, an
unpause, a resource that was not Ready.

Each test runs its own operator in an `own-*` namespace with `--resync-seconds=RESYNC`, so
a resource at rest is not observed within the first tenth of it (CALM seconds) after the
restart: "at once" means well within that. Cloud calls are counted in moto's recording of
every request it received, by the cloud names of the test's resources.
"""

from __future__ import annotations

import base64
import json
import time

import pytest

from tests.conftest import on_moto_only
from tests.helpers import (
    apply,
    manifests,
    merge_patch,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, on_moto_only]

GROUP = "cloud.provisioner.dev"
RESYNC = 300
CALM = RESYNC / 10
ARGS = [f"--resync-seconds={RESYNC}"]
AT_REST = 30
# Seconds after a restart in which the resources at rest make at most 0.2 calls each.
WINDOW = 25


def recorded(kube) -> list[str]:
    """The text (url and body) of every request moto received so far, in order."""
    path = kube.moto.record_to
    if path is None or not path.exists():
        return []
    texts = []
    for line in path.read_text(errors="replace").splitlines():
        entry = json.loads(line)
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            body = base64.b64decode(body).decode(errors="replace")
        texts.append(f"{entry.get('url', '')} {body}")
    return texts


def naming(texts: list[str], names: list[str]) -> list[str]:
    return [t for t in texts if any(n in t for n in names)]


def cloud_names(kube, namespace: str, kind: str, names: list[str]) -> list[str]:
    return [
        wait_ready(kube, kind, namespace, n, timeout=120)["status"]["externalName"] for n in names
    ]


def resource_versions(kube, namespace: str, names: list[str]) -> dict[str, str]:
    items = json.loads(kube.kubectl("get", "queues", "-n", namespace, "-o", "json").stdout)
    return {
        i["metadata"]["name"]: i["metadata"]["resourceVersion"]
        for i in items["items"]
        if i["metadata"]["name"] in names
    }


def visibility_timeout(aws, url: str) -> str:
    attrs = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    return attrs["Attributes"]["VisibilityTimeout"]


def test_restart_with_resources_at_rest_makes_almost_no_cloud_calls(
    kube, own_namespace, start_operator
):
    queues = [f"q{i:02d}" for i in range(AT_REST * 2 // 3)]
    buckets = [f"b{i:02d}" for i in range(AT_REST - len(queues))]
    first = start_operator(args=ARGS)
    apply(
        kube,
        own_namespace,
        manifests(
            [("Queue", n, "{visibilityTimeoutSeconds: 45}") for n in queues]
            + [("S3Bucket", n, "{}") for n in buckets]
        ),
    )
    names = cloud_names(kube, own_namespace, "queue", queues) + cloud_names(
        kube, own_namespace, "s3bucket", buckets
    )
    first.stop()
    versions = resource_versions(kube, own_namespace, queues)
    # Created while the operator was down: its create shows the new operator acting.
    apply(kube, own_namespace, manifests([("Queue", "marker", "{}")]))

    mark = len(recorded(kube))
    started = time.monotonic()
    start_operator(args=ARGS)
    # The measurement window: WINDOW seconds from the start of the new operator's process.
    wait_for(lambda: time.monotonic() - started >= WINDOW, timeout=2 * WINDOW, what="the window")
    window = recorded(kube)[mark:]
    assert naming(window, ["marker"]), "the new operator made no call within the window"
    calls = naming(window, names)
    assert len(calls) <= 0.2 * AT_REST, calls[:5]
    wait_ready(kube, "queue", own_namespace, "marker", timeout=60)
    # Not written either: the status of each is as the first operator left it.
    assert resource_versions(kube, own_namespace, queues) == versions


def test_spec_changed_while_down_is_reconciled_at_once(kube, aws, own_namespace, start_operator):
    first = start_operator(args=ARGS)
    apply(kube, own_namespace, manifests([("Queue", "changed", "{visibilityTimeoutSeconds: 45}")]))
    url = wait_ready(kube, "queue", own_namespace, "changed", timeout=90)["status"]["queueUrl"]
    first.stop()
    merge_patch(kube, "queue", own_namespace, "changed", '{"spec":{"visibilityTimeoutSeconds":50}}')
    start_operator(args=ARGS)
    wait_ready(kube, "queue", own_namespace, "changed", timeout=CALM, generation=2)
    assert visibility_timeout(aws, url) == "50"


def test_deleted_while_down_is_finalized_at_once(kube, aws, own_namespace, start_operator):
    first = start_operator(args=ARGS)
    apply(kube, own_namespace, manifests([("Queue", "deleted", "{}")]))
    url = wait_ready(kube, "queue", own_namespace, "deleted", timeout=90)["status"]["queueUrl"]
    first.stop()
    kube.kubectl("delete", "queue", "deleted", "-n", own_namespace, "--wait=false")
    start_operator(args=ARGS)
    wait_gone(kube, "queue", own_namespace, "deleted", timeout=CALM)
    queue_name = url.rstrip("/").rpartition("/")[2]
    assert aws.sqs.list_queues(QueueNamePrefix=queue_name).get("QueueUrls", []) == []


def test_not_ready_while_down_is_handled_at_once(kube, own_namespace, start_operator):
    first = start_operator(args=ARGS)
    # Waits for its dead-letter target, which does not exist yet.
    apply(
        kube,
        own_namespace,
        manifests([("Queue", "orders", "{deadLetter: {queueRef: {name: orders-dlq}}}")]),
    )
    wait_condition(kube, "queue", own_namespace, "orders", "Ready", "False", "WaitingForDependency")
    first.stop()
    # The target is created by the next operator; `orders` only resumes, not Ready.
    apply(kube, own_namespace, manifests([("Queue", "orders-dlq", "{}")]))
    start_operator(args=ARGS)
    wait_ready(kube, "queue", own_namespace, "orders", timeout=CALM)


def test_unpaused_while_down_is_handled_at_once(kube, aws, own_namespace, start_operator):
    first = start_operator(args=ARGS)
    apply(kube, own_namespace, manifests([("Queue", "held", "{visibilityTimeoutSeconds: 45}")]))
    wait_ready(kube, "queue", own_namespace, "held", timeout=90)
    kube.kubectl("annotate", "queue", "held", "-n", own_namespace, f"{GROUP}/paused=true")
    wait_condition(kube, "queue", own_namespace, "held", "Synced", "False", "Paused")
    merge_patch(kube, "queue", own_namespace, "held", '{"spec":{"visibilityTimeoutSeconds":50}}')
    first.stop()
    kube.kubectl("annotate", "queue", "held", "-n", own_namespace, f"{GROUP}/paused-")
    start_operator(args=ARGS)
    cr = wait_ready(kube, "queue", own_namespace, "held", timeout=CALM, generation=2)
    assert visibility_timeout(aws, cr["status"]["queueUrl"]) == "50"


def test_paused_while_down_makes_no_cloud_call(kube, own_namespace, start_operator):
    first = start_operator(args=ARGS)
    apply(kube, own_namespace, manifests([("Queue", "stopped", "{}")]))
    cr = wait_ready(kube, "queue", own_namespace, "stopped", timeout=90)
    name = cr["status"]["externalName"]
    first.stop()
    kube.kubectl("annotate", "queue", "stopped", "-n", own_namespace, f"{GROUP}/paused=true")
    mark = len(recorded(kube))
    start_operator(args=ARGS)
    wait_condition(kube, "queue", own_namespace, "stopped", "Synced", "False", "Paused", CALM)
    assert naming(recorded(kube)[mark:], [name]) == []


def test_resync_off_keeps_the_resume_a_full_pass(kube, aws, own_namespace, start_operator):
    """With the resync off nothing else would look at a resource again: the resume does."""
    args = ["--resync-seconds=0"]
    first = start_operator(args=args)
    apply(kube, own_namespace, manifests([("Queue", "watched", "{visibilityTimeoutSeconds: 45}")]))
    url = wait_ready(kube, "queue", own_namespace, "watched", timeout=90)["status"]["queueUrl"]
    first.stop()
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99"})
    start_operator(args=args)
    wait_for(lambda: visibility_timeout(aws, url) == "45", timeout=CALM, what="drift corrected")
