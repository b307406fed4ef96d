"""provisioner/tracing.py in-process: when tracing is on, what the spans of a pass and of its
AWS calls say (attempts, throttles, the call budget's wait), the trace id on Events and log
lines, and that no secret leaves in a span; when it is off, OpenTelemetry is never imported."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from provisioner import tracing
from provisioner.aws import errors
from provisioner.aws.budget import BudgetSettings, Limit
from provisioner.aws.session import Aws, AwsSettings
from provisioner.kube.client import written_resource
from provisioner.model.annotations import TRACE_ID
from provisioner.reconciler.outcome import Event
from provisioner.runtime.events import event_poster, traced

SECRET = "Pa55-w0rd-that-must-never-leave"
BODY = {
    "apiVersion": "cloud.provisioner.dev/v1beta1",
    "kind": "S3Bucket",
    "metadata": {"name": "b", "namespace": "ns", "uid": "u-1", "generation": 2},
}


@pytest.fixture
def spans() -> Iterator[Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    assert tracing.setup(exporter=exporter, environ={})
    try:
        yield exporter
    finally:
        tracing.shutdown()


def everything_said(finished: Any) -> str:
    """Every name, attribute, status and event of the spans, as one text."""
    said = []
    for s in finished:
        said += [s.name, json.dumps(dict(s.attributes or {}), default=str)]
        said += [str(s.status.description), *(json.dumps(dict(e.attributes)) for e in s.events)]
    return "\n".join(said)


def test_the_otel_variables_turn_tracing_on_and_off():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.configured(endpoint)
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    assert not tracing.configured({})
    assert not tracing.configured({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.configured({**endpoint, "OTEL_TRACES_EXPORTER": "none"})


def test_off_imports_no_opentelemetry_and_every_call_is_a_no_op():
    code = """
import sys
from provisioner import tracing
from provisioner.runtime import handlers, resync, events
from provisioner.aws import session
assert not tracing.setup(environ={})
with tracing.pass_span("create", {"metadata": {}}, "S3Bucket") as s:
    assert s is None and tracing.trace_id() == ""
with tracing.aws_call("1") as note:
    assert note is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_pass_is_one_trace_with_its_trigger_and_children(spans):
    with tracing.pass_span("create", BODY) as root:
        trace = tracing.trace_id()
        with tracing.span("placement"):
            tracing.set_attributes({"cloud.region": "eu-west-1", "cloud.account.id": ""})
        tracing.set_attributes({"provisioner.verdict": "done"})
    with tracing.pass_span("resync", BODY):
        other = tracing.trace_id()
    assert root is not None and len(trace) == 32 and other != trace
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == ["placement", "reconcile S3Bucket", "reconcile S3Bucket"]
    placement, top = finished[:2]
    assert placement.parent.span_id == top.context.span_id
    assert f"{placement.context.trace_id:032x}" == trace
    assert top.parent is None
    assert top.attributes["provisioner.trigger"] == "create"
    assert top.attributes["provisioner.retry"] == 0
    assert top.attributes["k8s.namespace.name"] == "ns"
    assert top.attributes["k8s.object.uid"] == "u-1"
    assert top.attributes["provisioner.verdict"] == "done"
    assert placement.attributes["cloud.region"] == "eu-west-1"
    assert "cloud.account.id" not in placement.attributes  # "" is left out


def test_a_throttled_call_and_its_retry_are_spans_of_one_pass(spans):
    aws = Aws(AwsSettings(region="us-east-1", max_wait=0.0))
    waits: list[float] = []
    aws.budget.sleep = waits.append
    s3 = aws.client("s3")
    with Stubber(s3) as stub, tracing.pass_span("create", BODY):
        stub.add_client_error("create_bucket", "SlowDown", http_status_code=503)
        stub.add_response("create_bucket", {"Location": "/b"})
        aws.call(s3.create_bucket, Bucket="b")
    calls = [s for s in spans.get_finished_spans() if s.name == "S3.CreateBucket"]
    assert len(calls) == 2
    first, second = sorted(calls, key=lambda s: s.start_time)
    assert (
        first.attributes["rpc.service"] == "S3" and first.attributes["rpc.method"] == "CreateBucket"
    )
    assert first.attributes["provisioner.aws.attempt"] == 1
    assert first.attributes["provisioner.aws.throttled"] is True
    assert first.attributes["aws.error.code"] == "SlowDown"
    assert second.attributes["provisioner.aws.attempt"] == 2
    assert second.attributes["provisioner.aws.retried"] is True
    assert second.attributes["provisioner.aws.previous_error"] == "SlowDown"
    assert "aws.error.code" not in second.attributes
    assert second.attributes["cloud.provider"] == "aws"
    root = next(s for s in spans.get_finished_spans() if s.name == "reconcile S3Bucket")
    assert {first.parent.span_id, second.parent.span_id} == {root.context.span_id}


def test_the_call_budgets_wait_is_on_the_span_it_held_back(spans):
    settings = AwsSettings(region="us-east-1", budget=BudgetSettings())
    settings.budget.limits["rds"] = Limit(burst=1, rate=4)
    aws = Aws(settings)
    slept: list[float] = []
    aws.budget.sleep = slept.append
    aws.budget.clock = lambda: 100.0  # time stands still: the second call must wait
    rds = boto3.client(
        "rds", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    with Stubber(rds) as stub:
        for _ in range(2):
            stub.add_response("describe_db_instances", {"DBInstances": []})
            aws.call(rds.describe_db_instances)
    calls = sorted(spans.get_finished_spans(), key=lambda s: s.start_time)
    assert [s.attributes["provisioner.aws.budget_wait_seconds"] for s in calls] == [0.0, 0.25]
    assert slept == [0.25]
    assert all(s.attributes["provisioner.aws.attempt"] == 1 for s in calls)


def test_no_password_reaches_a_span_even_when_botocore_quotes_it(spans):
    """botocore's instrumentation records an exception's message; a refused parameter's
    value is in it. The exporter gets the spans without it."""
    aws = Aws(AwsSettings(region="us-east-1", attempts=1))
    rds = boto3.client(
        "rds", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    create = {
        "DBInstanceIdentifier": "db",
        "DBInstanceClass": "db.t3.micro",
        "Engine": "postgres",
        "MasterUsername": "app",
    }
    with Stubber(rds) as stub, tracing.pass_span("create", BODY):
        stub.add_response("create_db_instance", {"DBInstance": {"DBInstanceIdentifier": "db"}})
        aws.call(rds.create_db_instance, MasterUserPassword=SECRET, **create)
        stub.add_client_error("modify_db_instance", "InvalidParameterValue", http_status_code=400)
        with pytest.raises(errors.TerminalError):
            aws.call(rds.modify_db_instance, DBInstanceIdentifier="db", MasterUserPassword=SECRET)
        # A password of the wrong type: botocore refuses it before any request, quoting it.
        stub.add_response("create_db_instance", {})
        with pytest.raises(errors.TerminalError):
            aws.call(rds.create_db_instance, MasterUserPassword={"p": SECRET}, **create)
    finished = spans.get_finished_spans()
    names = [s.name for s in finished]
    assert names.count("RDS.CreateDBInstance") == 2 and "RDS.ModifyDBInstance" in names
    refused = [s for s in finished if s.events]
    assert refused, "the refused call's exception is recorded (without the value)"
    said = everything_said(finished)
    assert "MasterUserPassword" in said and "value: (redacted)" in said
    assert SECRET not in said


def test_redact_cuts_every_quoted_value():
    report = (
        f"Invalid type for parameter MasterUserPassword, value: {SECRET}, type: <class 'dict'>"
        f"\nInvalid length for parameter X, value: {SECRET}, valid min length: 1"
    )
    assert SECRET not in tracing.redact(report)
    assert tracing.redact(report).startswith("Invalid type for parameter MasterUserPassword")
    assert tracing.redact("no values here") == "no values here"


def test_the_events_of_a_traced_pass_carry_its_trace_id(spans):
    posted: list[tuple[str, dict[str, str] | None, str]] = []

    class Recorder:
        def post_event(self, body, type_, reason, message, component, annotations=None):
            posted.append((message, annotations, tracing.trace_id()))

    with ThreadPoolExecutor(1) as pool:
        post = event_poster(Recorder(), pool)
        with tracing.pass_span("create", BODY):
            trace = tracing.trace_id()
            post(BODY, Event("Normal", "Created", "S3 bucket b created"))
        post(BODY, Event("Normal", "Other", "outside any pass"))
    (message, annotations, seen), (plain, none, _) = posted
    assert message == f"S3 bucket b created trace={trace}"
    assert annotations == {TRACE_ID: trace}
    assert seen == trace  # the post runs in the pass's trace (its write is a span of it)
    assert plain == "outside any pass" and none is None


def test_a_long_message_keeps_its_trace_id_within_the_api_servers_limit():
    trace = "a" * 32
    message = traced("x" * 2000, trace)
    assert len(message) == 1024 and message.endswith(f" trace={trace}")


def test_log_records_of_a_traced_pass_carry_its_trace_id(spans):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(tracing.TraceIdFilter())
    log = logging.getLogger("provisioner.test_tracing")
    log.addHandler(handler)
    try:
        with tracing.pass_span("update", BODY):
            log.warning("inside")
            trace = tracing.trace_id()
        log.warning("outside")
    finally:
        log.removeHandler(handler)
    assert records[0].trace_id == trace
    assert not hasattr(records[1], "trace_id")


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/api/v1/namespaces/ns/secrets", "secrets"),
        ("/api/v1/namespaces/ns/secrets/db-conn", "secrets"),
        ("/api/v1/namespaces/ns/events", "events"),
        (
            "/apis/cloud.provisioner.dev/v1beta1/namespaces/ns/s3buckets/b/status",
            "s3buckets/status",
        ),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/x", "leases"),
        ("/apis/cloud.provisioner.dev/v1alpha1/cloudaccounts/a/status", "cloudaccounts/status"),
    ],
)
def test_a_writes_span_names_what_it_writes(path, named):
    assert written_resource(path) == named
