"""`drift-policy: report` on every pass, not only the periodic resync.

A difference between the cloud and the spec that the user did not ask for is drift: under
`report` it is reported (`Drifted=True, DriftReported`, one Warning Event) and never written,
whatever pass finds it (a reconcile request, a label edit, the first resync after a restart
or the resume itself when the resync is off, a resync). Only a new generation writes to the
cloud, and then only the fields whose spec value changed. Without the annotation the same
drift is corrected, and named as drift.

Each test: a Queue Ready, `VisibilityTimeout` changed to 99 with boto3 behind the operator's
back, then the trigger; the cloud is checked once the operator has demonstrably handled it.
Cloud writes are counted in moto's recording of every request it received.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any
from urllib.parse import parse_qs

import pytest

from tests.conftest import on_moto_only
from tests.helpers import (
    apply,
    condition,
    events,
    get,
    merge_patch,
    wait_condition,
    wait_for,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, on_moto_only]

GROUP = "cloud.provisioner.dev"
SPEC_TIMEOUT = "45"
DRIFTED_TIMEOUT = "99"
DRIFT = f"spec.visibilityTimeoutSeconds: {DRIFTED_TIMEOUT} -> {SPEC_TIMEOUT}"


def queue_manifest(name: str, spec: str, report: bool = True) -> str:
    annotations = f"  annotations:\n    {GROUP}/drift-policy: report\n" if report else ""
    return (
        f"apiVersion: {GROUP}/v1alpha1\nkind: Queue\n"
        f"metadata:\n  name: {name}\n{annotations}spec: {spec}\n"
    )


# -- moto's recording -------------------------------------------------------------------


def recording(kube) -> list[dict[str, Any]]:
    """Every request moto received so far, in order: action, url and body."""
    path = kube.moto.record_to
    if path is None or not path.exists():
        return []
    requests = []
    for line in path.read_text(errors="replace").splitlines():
        entry = json.loads(line)
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            body = base64.b64decode(body).decode(errors="replace")
        headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
        # JSON protocol: "X-Amz-Target: AmazonSQS.SetQueueAttributes"; query: Action=...
        action = headers.get("x-amz-target", "").rpartition(".")[2]
        if not action:
            query = entry.get("url", "").partition("?")[2]
            action = (parse_qs(body).get("Action") or parse_qs(query).get("Action") or [""])[0]
        requests.append({"action": action, "text": f"{entry.get('url', '')} {body}"})
    return requests


def calls(kube, queue: str, action: str, since: int = 0) -> list[str]:
    """The `action` requests naming `queue` among moto's requests from index `since` on."""
    return [
        r["text"] for r in recording(kube)[since:] if r["action"] == action and queue in r["text"]
    ]


def drift(kube, aws, queue: str, url: str) -> int:
    """VisibilityTimeout to 99 behind the operator's back; the index of that request.

    Every SetQueueAttributes for the queue after that index is the operator's.
    """
    before = len(recording(kube))
    aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": DRIFTED_TIMEOUT})
    for index, request in enumerate(recording(kube)[before:], start=before):
        if request["action"] == "SetQueueAttributes" and queue in request["text"]:
            return index
    raise AssertionError("moto did not record the drifting SetQueueAttributes")


def operator_writes(kube, queue: str, mark: int) -> list[str]:
    return calls(kube, queue, "SetQueueAttributes", since=mark + 1)


def visibility_timeout(aws, url: str) -> str:
    attrs = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
    return attrs["Attributes"]["VisibilityTimeout"]


def wait_resyncs(kube, queue: str, count: int = 2) -> None:
    """`count` more observations of the queue by the periodic resync, from now on.

    Each observation reads all of the queue's attributes (`AttributeNames: ["All"]`; the test
    itself reads one by name), so anything a pass before them decided, Events included, has
    been carried out when this returns.
    """
    since = len(recording(kube))

    def observations() -> int:
        reads = calls(kube, queue, "GetQueueAttributes", since=since)
        return sum('"All"' in text for text in reads)

    wait_for(
        lambda: observations() >= count,
        timeout=90,
        what=f"{count} resyncs of {queue}",
    )


def request_reconcile(kube, namespace: str, name: str, value: str) -> dict[str, Any]:
    """Set reconcile-requested-at and wait until a pass has acted on it."""
    kube.kubectl(
        "annotate",
        "queue",
        name,
        "-n",
        namespace,
        "--overwrite",
        f"{GROUP}/reconcile-requested-at={value}",
    )
    return wait_for(
        lambda: (
            (cr := get(kube, "queue", namespace, name))
            and (cr.get("status") or {}).get("lastReconcileRequest") == value
            and cr
        ),
        timeout=90,
        what=f"status.lastReconcileRequest to be {value}",
    )


def label_and_wait(kube, namespace: str, name: str, label: str) -> dict[str, Any]:
    """`kubectl label`, then wait until the change handlers have handled that edit.

    The framework records the metadata and spec it last handled in
    status.kopf.lastHandledConfiguration, in the same patch as the pass's status.
    """
    key, _, value = label.partition("=")
    kube.kubectl("label", "queue", name, "-n", namespace, "--overwrite", label)

    def handled() -> dict[str, Any] | None:
        cr = get(kube, "queue", namespace, name)
        raw = ((cr or {}).get("status") or {}).get("kopf", {}).get("lastHandledConfiguration")
        labels = (json.loads(raw).get("metadata") or {}).get("labels") or {} if raw else {}
        return cr if labels.get(key) == value else None

    return wait_for(handled, timeout=90, what=f"the label {label} to be handled")


def event_list(kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events(kube, namespace, name) if e["reason"] == reason]


# -- assertions ---------------------------------------------------------------------


def assert_reported_not_written(
    kube, aws, namespace: str, name: str, queue: str, url: str, mark: int
) -> None:
    """The drift stays in the cloud and is reported once, as a Warning."""
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    cr = get(kube, "queue", namespace, name)
    assert cr is not None
    drifted = condition(cr, "Drifted")
    assert drifted is not None, cr["status"]
    assert (drifted["status"], drifted["reason"]) == ("True", "DriftReported"), drifted
    assert drifted["message"] == DRIFT
    assert operator_writes(kube, queue, mark) == []
    warnings = event_list(kube, namespace, name, "Drifted")
    assert [(e["type"], e["message"]) for e in warnings] == [
        ("Warning", f"not corrected (report only): {DRIFT}")
    ]
    assert event_list(kube, namespace, name, "Updated") == []


def ready_queue(kube, namespace: str, name: str, spec: str, report: bool = True) -> tuple[str, str]:
    """Apply a Queue, wait until it is Ready; its cloud name and URL."""
    apply(kube, namespace, queue_manifest(name, spec, report))
    status = wait_ready(kube, "queue", namespace, name, timeout=90)["status"]
    return status["externalName"], status["queueUrl"]


# -- the paths ----------------------------------------------------------------------

SPEC = f"{{visibilityTimeoutSeconds: {SPEC_TIMEOUT}}}"


def test_reconcile_request_reports_drift_and_leaves_it(kube, operator, aws, namespace):
    queue, url = ready_queue(kube, namespace, "asked", SPEC)
    mark = drift(kube, aws, queue, url)
    request_reconcile(kube, namespace, "asked", "now-1")
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    assert condition(get(kube, "queue", namespace, "asked"), "Drifted")["status"] == "True"
    wait_resyncs(kube, queue)
    assert_reported_not_written(kube, aws, namespace, "asked", queue, url, mark)


def test_label_edit_reports_drift_and_leaves_it(kube, operator, aws, namespace):
    queue, url = ready_queue(kube, namespace, "labelled", SPEC)
    mark = drift(kube, aws, queue, url)
    cr = label_and_wait(kube, namespace, "labelled", "team=payments")
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    assert condition(cr, "Drifted")["status"] == "True"
    wait_resyncs(kube, queue)
    assert_reported_not_written(kube, aws, namespace, "labelled", queue, url, mark)


RESTART_RESYNC = 8


def test_operator_restart_reports_drift_within_the_resync_period_and_leaves_it(
    kube, aws, own_namespace, start_operator
):
    # A restart does not observe a resource at rest at once: its first resync, spread over
    # one period from a tenth of it on, finds the drift.
    args = [f"--resync-seconds={RESTART_RESYNC}"]
    first = start_operator(args=args)
    queue, url = ready_queue(kube, own_namespace, "resumed", SPEC)
    first.stop()
    mark = drift(kube, aws, queue, url)
    started = time.monotonic()
    start_operator(args=args)
    cr = wait_condition(
        kube, "queue", own_namespace, "resumed", "Drifted", "True", "DriftReported", timeout=90
    )
    # 1.1 periods at most, and the time the operator takes to start on a busy machine.
    assert time.monotonic() - started < 1.1 * RESTART_RESYNC + 30
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    # One more pass that changes nothing: by its end, the Events of the resync are posted.
    request_reconcile(kube, own_namespace, "resumed", "after-restart")
    assert_reported_not_written(kube, aws, own_namespace, "resumed", queue, url, mark)


def test_operator_restart_without_resync_reports_drift_and_leaves_it(
    kube, aws, own_namespace, start_operator
):
    # Without the periodic resync, the resume at start-up is a full pass: the only one.
    no_resync = ["--resync-seconds=0"]
    first = start_operator(args=no_resync)
    queue, url = ready_queue(kube, own_namespace, "restarted", SPEC)
    first.stop()
    mark = drift(kube, aws, queue, url)
    start_operator(args=no_resync)
    cr = wait_condition(
        kube, "queue", own_namespace, "restarted", "Drifted", "True", "DriftReported", timeout=90
    )
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    # One more pass that changes nothing: by its end, the Events of the resume are posted.
    request_reconcile(kube, own_namespace, "restarted", "after-restart")
    assert_reported_not_written(kube, aws, own_namespace, "restarted", queue, url, mark)


def test_resync_reports_drift_and_leaves_it(kube, operator, aws, namespace):
    queue, url = ready_queue(kube, namespace, "resynced", SPEC)
    mark = drift(kube, aws, queue, url)
    wait_condition(
        kube, "queue", namespace, "resynced", "Drifted", "True", "DriftReported", timeout=90
    )
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    wait_resyncs(kube, queue)
    assert_reported_not_written(kube, aws, namespace, "resynced", queue, url, mark)


def test_spec_change_writes_only_the_changed_field(kube, operator, aws, namespace):
    queue, url = ready_queue(
        kube,
        namespace,
        "changed",
        f"{{visibilityTimeoutSeconds: {SPEC_TIMEOUT}, messageRetentionSeconds: 3600}}",
    )
    mark = drift(kube, aws, queue, url)
    merge_patch(kube, "queue", namespace, "changed", '{"spec":{"messageRetentionSeconds":7200}}')
    wait_ready(kube, "queue", namespace, "changed", timeout=90, generation=2)
    attrs = aws.sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "MessageRetentionPeriod"]
    )["Attributes"]
    assert attrs == {"VisibilityTimeout": DRIFTED_TIMEOUT, "MessageRetentionPeriod": "7200"}
    wait_resyncs(kube, queue)
    writes = operator_writes(kube, queue, mark)
    assert len(writes) == 1, writes
    assert "MessageRetentionPeriod" in writes[0] and "VisibilityTimeout" not in writes[0]
    cr = get(kube, "queue", namespace, "changed")
    drifted = condition(cr, "Drifted")
    assert (drifted["status"], drifted["reason"], drifted["message"]) == (
        "True",
        "DriftReported",
        DRIFT,
    )
    assert visibility_timeout(aws, url) == DRIFTED_TIMEOUT
    assert [e["message"] for e in event_list(kube, namespace, "changed", "Updated")] == [
        "updated spec.messageRetentionSeconds"
    ]
    assert [
        (e["type"], e["message"]) for e in event_list(kube, namespace, "changed", "Drifted")
    ] == [("Warning", f"not corrected (report only): {DRIFT}")]


def test_default_policy_corrects_drift_on_a_label_edit(kube, aws, own_namespace, start_operator):
    # Without the periodic resync, the label edit's pass is the only one that can act.
    start_operator(args=["--resync-seconds=0"])
    queue, url = ready_queue(kube, own_namespace, "corrected", SPEC, report=False)
    mark = drift(kube, aws, queue, url)
    cr = label_and_wait(kube, own_namespace, "corrected", "team=payments")
    drifted = condition(cr, "Drifted")
    assert drifted is not None, cr["status"]
    assert (drifted["status"], drifted["reason"], drifted["message"]) == (
        "False",
        "DriftCorrected",
        DRIFT,
    )
    assert visibility_timeout(aws, url) == SPEC_TIMEOUT
    writes = operator_writes(kube, queue, mark)
    assert len(writes) == 1 and "VisibilityTimeout" in writes[0], writes
    # One more pass that changes nothing: by its end, the label pass's Events are posted.
    request_reconcile(kube, own_namespace, "corrected", "after-label")
    assert [
        (e["type"], e["message"]) for e in event_list(kube, own_namespace, "corrected", "Drifted")
    ] == [("Warning", f"corrected: {DRIFT}")]
    assert event_list(kube, own_namespace, "corrected", "Updated") == []
    assert len(operator_writes(kube, queue, mark)) == 1
