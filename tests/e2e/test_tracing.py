"""Traces from a custom resource's change to each AWS call, in a real Jaeger (v1.75, built
from its pinned Go module in hack/jaeger): the operator runs with the standard OTEL_*
variables pointing at it, and the id a user finds on the `Created` Event opens the pass's
trace, whose spans hold the CreateBucket call and the status write; a throttle injected by
the fault proxy shows as a failed call and its retries in that trace."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.model.annotations import TRACE_ID
from provisioner_dev.binaries import BuildError
from provisioner_dev.jaeger import JAEGER_VERSION, Jaeger, ensure_jaeger
from tests.helpers import apply, events, manifests, wait_for, wait_ready

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    try:
        binary = ensure_jaeger()
    except BuildError as exc:
        pytest.skip(f"Jaeger {JAEGER_VERSION} cannot be built from hack/jaeger here: {exc}")
    server = Jaeger(binary=binary, log=tmp_path_factory.mktemp("jaeger") / "jaeger.log")
    server.start()
    yield server
    server.stop()


def traced(jaeger: Jaeger, namespace: str) -> dict[str, str]:
    """The operator's environment for traces into `jaeger`, batched for 200 ms at most."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
        "OTEL_SERVICE_NAME": f"provisioner-{namespace}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags") or []}


def created_trace(kube: Any, namespace: str, name: str) -> str:
    """The trace id on the resource's `Created` Event: in its message (what `kubectl
    describe` shows) and in its annotation, the same."""
    (created,) = wait_for(
        lambda: events(kube, namespace, name, "Created"), what=f"the Created Event of {name}"
    )
    found = re.search(r" trace=([0-9a-f]{32})$", created["message"])
    assert found, created["message"]
    assert created["metadata"]["annotations"][TRACE_ID] == found[1]
    return found[1]


def wait_trace(
    jaeger: Jaeger, trace: str, *names: str, throttled: bool = False
) -> list[dict[str, Any]]:
    """The spans of `trace` once Jaeger has every span named in `names` (they arrive in
    batches, the Event's own post last), and (`throttled`) a throttled call's."""

    seen: list[tuple[str, Any, Any]] = []

    def complete() -> list[dict[str, Any]] | None:
        found = jaeger.trace(trace)
        spans = (found or {}).get("spans") or []
        seen[:] = [
            (s["operationName"], tags(s).get("aws.error.code"), tags(s).get("provisioner.trigger"))
            for s in spans
        ]
        if not set(names) <= {s["operationName"] for s in spans}:
            return None
        if throttled and not any(tags(s).get("http.status_code") == 503 for s in spans):
            return None
        return spans

    try:
        return wait_for(complete, timeout=60, what=f"trace {trace} with {names} in Jaeger")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its spans: {seen}") from None


def test_a_bucket_create_is_one_trace_from_its_event_to_its_aws_calls(
    kube, own_namespace, start_operator, jaeger
):
    op = start_operator(env=traced(jaeger, own_namespace), args=["--log-format=json"])
    apply(kube, own_namespace, manifests([("S3Bucket", "traced", "{}")]))
    cr = wait_ready(kube, "s3bucket", own_namespace, "traced")
    trace = created_trace(kube, own_namespace, "traced")
    spans = wait_trace(
        jaeger,
        trace,
        "reconcile S3Bucket",
        "placement",
        "S3.CreateBucket",
        "k8s PATCH s3buckets/status",
        "k8s POST events",
    )
    assert {s["traceID"] for s in spans} == {trace}
    by_name = {s["operationName"]: s for s in spans}
    (root,) = [s for s in spans if not s.get("references")]
    assert root is by_name["reconcile S3Bucket"]
    top = tags(root)
    assert top["provisioner.trigger"] == "create"
    assert top["k8s.namespace.name"] == own_namespace
    assert top["k8s.object.name"] == "traced"
    assert top["k8s.object.uid"] == cr["metadata"]["uid"]
    assert "Created" in top["provisioner.events"]
    # Every other span hangs under the root (directly or through another span of the pass).
    ids = {s["spanID"] for s in spans}
    for s in spans:
        if s is not root:
            assert s["references"][0]["spanID"] in ids, s["operationName"]

    call = tags(by_name["S3.CreateBucket"])
    assert (call["rpc.system"], call["rpc.service"], call["rpc.method"]) == (
        "aws-api",
        "S3",
        "CreateBucket",
    )
    assert call["cloud.provider"] == "aws" and call["cloud.region"]
    assert call["provisioner.aws.attempt"] == 1 and call["provisioner.aws.retried"] is False
    assert "provisioner.aws.budget_wait_seconds" in call
    # Two status writes: the operator's own (the bucket's name and create token, before
    # CreateBucket) and kopf's at the end of the pass, which holds the conditions.
    writes = [tags(s) for s in spans if s["operationName"] == "k8s PATCH s3buckets/status"]
    (status,) = [w for w in writes if w.get("provisioner.status.written_by") == "kopf"]
    assert "conditions" in status["provisioner.status.fields"]
    processes = (jaeger.trace(trace) or {})["processes"]
    process = processes[by_name["S3.CreateBucket"]["processID"]]
    assert process["serviceName"] == f"provisioner-{own_namespace}"

    # The JSON log line of the Event names the same trace.
    lines = [json.loads(line) for line in op.log.read_text().splitlines() if line.strip()]
    logged = [r for r in lines if r.get("event_reason") == "Created"]
    assert logged and logged[0].get("trace_id") == trace, logged


def test_a_throttled_aws_call_shows_as_retried_in_the_passs_trace(
    kube, own_namespace, start_operator, fault_proxy, jaeger
):
    op = start_operator(endpoint_url=fault_proxy.url, env=traced(jaeger, own_namespace))
    # The operator asks STS for its own account once, at start: answered before the faults.
    wait_for(
        lambda: fault_proxy.stats()["by_operation"].get("sts|GetCallerIdentity|forwarded"),
        what="the operator's own account to be asked",
    )
    fault_proxy.configure(rate=1.0, faults=["throttle"])
    apply(kube, own_namespace, manifests([("S3Bucket", "throttled", "{}")]))
    wait_for(
        lambda: [
            key
            for key, n in fault_proxy.stats()["by_operation"].items()
            if key.startswith("s3|") and key.endswith("|throttle") and n
        ],
        what="an S3 call to be throttled",
    )
    fault_proxy.configure(rate=0.0)
    wait_ready(kube, "s3bucket", own_namespace, "throttled", timeout=120)
    trace = created_trace(kube, own_namespace, "throttled")
    spans = wait_trace(jaeger, trace, "reconcile S3Bucket", "S3.CreateBucket", throttled=True)
    spans.sort(key=lambda s: s["startTime"])
    # The proxy answers as S3 does when it throttles: 503 SlowDown, which a HEAD request's
    # answer carries no body to say (botocore then names the error by its status, "503").
    first = next(s for s in spans if tags(s).get("http.status_code") == 503)
    code = tags(first)["aws.error.code"]
    assert code in ("SlowDown", "503"), tags(first)
    assert tags(first)["provisioner.aws.throttled"] is (code == "SlowDown")
    # The same call again, in the same pass: numbered, marked retried, saying why.
    again = [
        tags(s)
        for s in spans
        if s["operationName"] == first["operationName"] and s["startTime"] > first["startTime"]
    ]
    assert again, f"no retry of {first['operationName']} in the trace"
    assert all(t["provisioner.aws.retried"] is True for t in again)
    last = again[-1]
    assert last["provisioner.aws.attempt"] == len(again) + tags(first)["provisioner.aws.attempt"]
    assert last["provisioner.aws.previous_error"] in ("SlowDown", "503")
    assert last["http.status_code"] != 503, op.log
