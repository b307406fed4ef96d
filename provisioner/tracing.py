"""Traces (OpenTelemetry): one trace per reconcile pass, off unless configured.

Tracing is on when the standard variables ask for it: OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, OTEL_SDK_DISABLED is not "true" and
OTEL_TRACES_EXPORTER is not "none". The exporter sends OTLP over HTTP and reads the other
OTEL_* variables itself (headers, timeout, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_BSP_* for the batching). While it is off, OpenTelemetry is never imported: every
function here is then a no-op that costs one check.

A pass's root span names what started it (`provisioner.trigger`); under it are spans for
placement, each AWS call (botocore's instrumentation, with the call budget's wait and this
call's attempt added here), each write to the API server, and the outcome as attributes.
Nothing that could hold a secret is recorded: no request or response bodies, and
exception messages lose any quoted parameter value before they leave (`Redacting`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AttributeValue = str | bool | int | float | Sequence[str]

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_trace_api: Any = None  # the opentelemetry.trace module while tracing is on
_provider: Any = None
# The AWS error codes that mean "slow down" (filled by provisioner/aws/budget.py).
THROTTLE_CODES: set[str] = set()
# botocore quotes a refused parameter's value ("..., value: hunter2, type: ..."): everything
# from there on goes (a value may hold anything, commas and newlines included).
_QUOTED_VALUE = re.compile(r"\bvalue: .*", re.S)


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables turn tracing on."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporters in ("", "none"):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def enabled() -> bool:
    return _tracer is not None


def setup(
    version: str = "",
    environ: Mapping[str, str] = os.environ,
    exporter: Any = None,
) -> bool:
    """Turn tracing on if the environment asks for it (or `exporter` is given: spans go
    there at once, for tests); whether it is on."""
    global _tracer, _trace_api, _provider
    if _tracer is not None:
        return True
    if exporter is None and not configured(environ):
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attributes: dict[str, str] = {}
    if not environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "provisioner"
    if version:
        attributes["service.version"] = version
    provider = TracerProvider(resource=Resource.create(attributes))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        outgoing: Any = Redacting(OTLPSpanExporter())
        provider.add_span_processor(BatchSpanProcessor(outgoing))
    else:
        outgoing = Redacting(exporter)
        provider.add_span_processor(SimpleSpanProcessor(outgoing))
    BotocoreInstrumentor().instrument(  # type: ignore[no-untyped-call]
        tracer_provider=provider, request_hook=_aws_request, response_hook=_aws_response
    )
    _provider, _trace_api = provider, trace
    _tracer = provider.get_tracer("provisioner")
    return True


def shutdown() -> None:
    """Send what is batched and turn tracing off (a no-op while it is off)."""
    global _tracer, _trace_api, _provider
    if _provider is None:
        return
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor

    BotocoreInstrumentor().uninstrument()  # type: ignore[no-untyped-call]
    _provider.shutdown()
    _tracer = _trace_api = _provider = None


# -- spans --------------------------------------------------------------------------------


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    cleaned: dict[str, AttributeValue] = {}
    for key, value in (attributes or {}).items():
        if value is None or value == "":
            continue
        if isinstance(value, str | bool | int | float):
            cleaned[key] = value
        else:
            cleaned[key] = [str(v) for v in value]
    return cleaned


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, root: bool = False
) -> Iterator[Any]:
    """A span around the block (a child of the current one; `root`: a trace of its own).
    Yields the span, or None while tracing is off."""
    if _tracer is None:
        yield None
        return
    context = _trace_api.set_span_in_context(_trace_api.INVALID_SPAN) if root else None
    with _tracer.start_as_current_span(name, context=context, attributes=_clean(attributes)) as s:
        yield s


def pass_span(trigger: str, body: Mapping[str, Any], kind: str = "", retry: int = 0) -> Any:
    """The root span of one reconcile pass over the custom resource `body`: what started it
    (`trigger`: create, update, resume, delete, resync, recheck, expiry; `retry`: how many
    passes for the same change failed or waited before this one) and which object it is
    (there is no semantic convention for a custom resource: k8s.object.*)."""
    if _tracer is None:
        return contextlib.nullcontext()
    meta = body.get("metadata") or {}
    kind = kind or str(body.get("kind") or "")
    attributes = {
        "provisioner.trigger": trigger,
        "provisioner.retry": retry,
        "k8s.namespace.name": meta.get("namespace"),
        "k8s.object.kind": kind,
        "k8s.object.name": meta.get("name"),
        "k8s.object.uid": meta.get("uid"),
        "k8s.object.generation": meta.get("generation"),
        "k8s.object.resource_version": meta.get("resourceVersion"),
    }
    return span(f"reconcile {kind}", attributes, root=True)


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span (none while tracing is off)."""
    if _tracer is None:
        return
    current = _trace_api.get_current_span()
    if current.is_recording():
        current.set_attributes(_clean(attributes))


def trace_id() -> str:
    """The current trace's id (32 hex digits), "" when there is none or tracing is off."""
    if _tracer is None:
        return ""
    context = _trace_api.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else ""


def in_current_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` to be run elsewhere (another thread) as a child of the current span."""
    if _tracer is None:
        return fn
    context = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> Any:
        return context.run(fn, *args, **kwargs)

    return run


class TraceIdFilter(logging.Filter):
    """Gives each log record `trace_id`, the current trace's id (while tracing is on and a
    pass is being traced): the JSON log lines carry it as a field."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _tracer is not None and not hasattr(record, "trace_id"):
            current = trace_id()
            if current:
                record.trace_id = current
        return True


# -- AWS calls ------------------------------------------------------------------------------


@dataclass
class CallNote:
    """What one Aws.call knows of its attempts, for the spans of its calls to the cloud."""

    account: str = ""
    attempt: int = 0
    waited: float = 0.0  # the call budget's wait before the next attempt (seconds)
    previous: str = ""  # the error code the previous attempt got


_NOTE: contextvars.ContextVar[CallNote | None] = contextvars.ContextVar("call_note", default=None)


@contextlib.contextmanager
def aws_call(account: str = "") -> Iterator[CallNote | None]:
    """Around Aws.call: its attempts are numbered on their spans."""
    if _tracer is None:
        yield None
        return
    token = _NOTE.set(CallNote(account=account))
    try:
        yield _NOTE.get()
    finally:
        _NOTE.reset(token)


def budget_waited(seconds: float) -> None:
    """The call budget held the next attempt back `seconds`."""
    note = _NOTE.get()
    if note is not None:
        note.waited += seconds


def attempt_failed(code: str) -> None:
    """The last attempt failed with `code` (and is tried again, or not)."""
    note = _NOTE.get()
    if note is not None:
        note.previous = code


def _aws_request(span: Any, service: str, operation: str, params: Any) -> None:
    """botocore's request hook: never reads `params` (a password may be among them)."""
    if not span.is_recording():
        return
    attributes: dict[str, Any] = {"cloud.provider": "aws", "aws.service": service}
    note = _NOTE.get()
    if note is not None:
        note.attempt += 1
        attributes.update(
            {
                "cloud.account.id": note.account,
                "provisioner.aws.attempt": note.attempt,
                "provisioner.aws.retried": note.attempt > 1,
                "provisioner.aws.previous_error": note.previous,
                "provisioner.aws.budget_wait_seconds": round(note.waited, 6),
            }
        )
        note.waited = 0.0
    span.set_attributes(_clean(attributes))


def _aws_response(span: Any, service: str, operation: str, result: Any) -> None:
    """botocore's response hook: the error code (and whether it was a throttle), only."""
    if not span.is_recording() or not isinstance(result, dict):
        return
    code = str((result.get("Error") or {}).get("Code") or "")
    if code:
        span.set_attributes(
            {"aws.error.code": code, "provisioner.aws.throttled": code in THROTTLE_CODES}
        )


# -- what leaves the process ----------------------------------------------------------------


def redact(text: str) -> str:
    """A message without any parameter value botocore quotes in it."""
    return _QUOTED_VALUE.sub("value: (redacted)", text)


class Redacting:
    """A span exporter in front of another: span statuses and exception events lose the
    parameter values botocore quotes in its messages (ParamValidationError says "value: ..."
    of a refused parameter, which may be MasterUserPassword)."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[Any]) -> Any:
        return self.exporter.export([_redacted(s) for s in spans])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.exporter.force_flush(timeout_millis))


def _redacted(readable: Any) -> Any:
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Status

    status = readable.status
    if status.description:
        status = Status(status.status_code, redact(status.description))
    events = [
        Event(
            e.name,
            {k: redact(v) if isinstance(v, str) else v for k, v in (e.attributes or {}).items()},
            e.timestamp,
        )
        for e in readable.events
    ]
    return ReadableSpan(
        name=readable.name,
        context=readable.context,
        parent=readable.parent,
        resource=readable.resource,
        attributes=readable.attributes,
        events=events,
        links=readable.links,
        kind=readable.kind,
        status=status,
        start_time=readable.start_time,
        end_time=readable.end_time,
        instrumentation_scope=readable.instrumentation_scope,
    )
