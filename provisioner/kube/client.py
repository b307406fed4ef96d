"""The few Kubernetes API calls the operator makes itself (kopf makes the rest).

Plain dicts in and out over urllib3 (no client library, no model (de)serialisation), so a
call costs little CPU and memory; credentials as `provisioner.kube.login` finds them.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, unquote, urlencode

import urllib3

from provisioner import API_VERSION, tracing
from provisioner.kinds.registry import PLURALS
from provisioner.kube import login as kubelogin


def written_resource(path: str) -> str:
    """What an API path names, as a span calls it: "secrets", "s3buckets/status", "events"."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts[:-1]:
        parts = parts[parts.index("namespaces") + 2 :]
    elif parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if not parts:
        return "namespaces"
    return parts[0] + ("/" + parts[2] if len(parts) > 2 else "")


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


# Kubernetes' own rules for object names (k8s.io/apimachinery/pkg/util/validation).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SUBDOMAIN_RULE = (
    "must be a lowercase RFC 1123 subdomain: at most 253 characters, lowercase letters, "
    "digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
)
LABEL_RULE = (
    "must be a lowercase RFC 1123 label: at most 63 characters, lowercase letters, "
    "digits and '-', starting and ending with a letter or digit"
)
_RULES = {
    "subdomain": (re.compile(rf"{_LABEL}(\.{_LABEL})*"), 253, SUBDOMAIN_RULE),
    "label": (re.compile(_LABEL), 63, LABEL_RULE),
}
# The event name's random suffix: "." and 16 hex digits.
_EVENT_SUFFIX = 17


class InvalidName(KubeError):
    """A name that no Kubernetes object can have, refused before any request is made (so that
    no name can turn into another path: `..`, `/`, `%2F`, ...). Status 422, reason Invalid,
    as the API server itself would answer; the message names the value and the rule."""

    def __init__(self, what: str, value: str, rule: str) -> None:
        shown = value if len(value) <= 80 else f"{value[:77]}..."
        super().__init__(422, "Invalid", f"{what} {json.dumps(shown)} is not valid: {rule}")
        self.what = what
        self.value = value


def valid_name(value: object, kind: str = "subdomain") -> bool:
    """Whether `value` is a DNS-1123 `subdomain` (most object names) or `label` (namespaces)."""
    pattern, longest, _ = _RULES[kind]
    return isinstance(value, str) and len(value) <= longest and bool(pattern.fullmatch(value))


def segment(value: object, what: str, kind: str = "subdomain") -> str:
    """`value` as one path segment: checked against Kubernetes' rule for it, then encoded."""
    if not valid_name(value, kind):
        raise InvalidName(what, str(value), _RULES[kind][2])
    return quote(str(value), safe="")


def event_name(object_name: str) -> str:
    """A unique, valid Event name for an object: its name (shortened so the whole fits in
    253 characters, never ending in '.' or '-') and a random suffix."""
    prefix = object_name[: 253 - _EVENT_SUFFIX].rstrip(".-")
    if not valid_name(prefix):
        prefix = "provisioner"
    return f"{prefix}.{secrets.token_hex(8)}"


def _check_path(path: str) -> None:
    """A path may hold no dot segment, query or fragment, however it was built: urllib3
    would collapse `..` into another resource's path."""
    if "?" in path or "#" in path or not path.startswith("/"):
        raise InvalidName("API path", path, "must be an absolute path with no query")
    for part in path.split("/")[1:]:
        if unquote(part) in (".", "..") or "/" in unquote(part):
            raise InvalidName("API path", path, "must have no '.', '..' or encoded '/' segment")


class Kube:
    def __init__(self, pool_size: int = 32, creds: kubelogin.Credentials | None = None):
        self.creds = creds or kubelogin.login()
        self.http = urllib3.PoolManager(
            maxsize=pool_size,
            ssl_context=self.creds.ssl_context(),
            # A refused or dropped connection is tried again; an answer never is.
            retries=urllib3.Retry(total=3, connect=3, read=0, status=0, redirect=0),
            timeout=urllib3.Timeout(total=30),
        )
        # The API server's clock minus ours (seconds), from its answers' Date headers: times
        # that count (spec.ttl) are the API server's, never this pod's.
        self.skew = 0.0

    def server_now(self) -> datetime:
        """The API server's time now, as far as its last answer tells."""
        return datetime.fromtimestamp(time.time() + self.skew, UTC)

    def _clock(self, resp: object) -> None:
        headers = getattr(resp, "headers", None)
        date = headers.get("Date") if headers is not None else None
        if not date:
            return
        try:
            # Date has whole seconds: the server's clock is at least that, within a second.
            self.skew = parsedate_to_datetime(str(date)).timestamp() + 0.5 - time.time()
        except (TypeError, ValueError):
            pass

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | list[Any] | None = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        accept: str = "application/json",
    ) -> dict[str, Any] | None:
        """Returns the decoded response; None for a 404. A write is a span of the current
        trace (while tracing is on): its method and path, never its body."""
        if method == "GET" or not tracing.enabled():
            return self._request(method, path, body, content_type, query, accept)
        attributes = {
            "http.request.method": method,
            "url.path": path,
            "k8s.api.resource": written_resource(path),
        }
        with tracing.span(f"k8s {method} {written_resource(path)}", attributes):
            return self._request(method, path, body, content_type, query, accept)

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | list[Any] | None,
        content_type: str,
        query: list[tuple[str, str]] | None,
        accept: str,
    ) -> dict[str, Any] | None:
        _check_path(path)
        url = self.creds.server + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Content-Type": content_type, "Accept": accept}
        headers.update(self.creds.headers())
        payload = json.dumps(body).encode() if body is not None else None
        try:
            resp = self.http.request(method, url, body=payload, headers=headers)
        except urllib3.exceptions.SSLError as exc:
            raise KubeError(0, "SSLError", str(exc)) from None
        data = resp.data
        self._clock(resp)
        if resp.status == 404:
            return None
        if resp.status >= 400:
            try:
                problem = json.loads(data or b"{}")
            except ValueError:
                problem = {}
            raise KubeError(
                resp.status,
                str(problem.get("reason") or resp.reason),
                str(problem.get("message") or resp.reason),
            )
        return json.loads(data) if data else {}

    # Secrets -------------------------------------------------------------------

    @staticmethod
    def _namespace_path(namespace: str) -> str:
        return f"/api/v1/namespaces/{segment(namespace, 'namespace', 'label')}"

    @classmethod
    def _secret_path(cls, namespace: str, name: str | None = None) -> str:
        base = f"{cls._namespace_path(namespace)}/secrets"
        return base if name is None else f"{base}/{segment(name, 'Secret name')}"

    def get_namespace(self, namespace: str) -> dict[str, Any] | None:
        return self.request("GET", self._namespace_path(namespace))

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", self._secret_path(namespace, name))

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return self.request("POST", self._secret_path(namespace), body)

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.request("PUT", self._secret_path(namespace, name), body)

    def delete_secret(self, namespace: str, name: str, uid: str | None = None) -> None:
        body = {"preconditions": {"uid": uid}} if uid else None
        path = self._secret_path(namespace, name)
        try:
            self.request("DELETE", path, body)
        except KubeError as exc:
            if exc.status != 409:  # uid precondition failed: it is someone else's now
                raise

    # Events -----------------------------------------------------------------------

    def post_event(
        self,
        body: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        component: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """A core/v1 Event on the object, as `kubectl describe` shows it (for a
        cluster-scoped object, in the namespace `default`, as kubectl's own are)."""
        meta = body["metadata"]
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metadata: dict[str, Any] = {"name": event_name(str(meta["name"])), "namespace": namespace}
        if annotations:
            metadata["annotations"] = annotations
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": {
                "apiVersion": body.get("apiVersion", API_VERSION),
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace", ""),
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "eventTime": None,
            "count": 1,
        }
        self.request("POST", f"{self._namespace_path(namespace)}/events", event)

    # Custom resources -----------------------------------------------------------

    @staticmethod
    def _cr_path(kind: str, namespace: str, name: str) -> str:
        plural = segment(PLURALS[kind], "resource", "label")
        namespace = segment(namespace, "namespace", "label")
        name = segment(name, f"{kind} name")
        return f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}/{name}"

    def get_resource(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", self._cr_path(kind, namespace, name))

    def delete_resource(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete it if it still is the object `uid` (a 409 otherwise, ignored)."""
        path = self._cr_path(kind, namespace, name)
        try:
            self.request("DELETE", path, {"preconditions": {"uid": uid}})
        except KubeError as exc:
            if exc.status != 409:
                raise

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.request(
            "PATCH",
            self._cr_path(kind, namespace, name) + "/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    # ServiceAccounts (spec.access with IRSA) --------------------------------------

    @classmethod
    def _sa_path(cls, namespace: str, name: str) -> str:
        name = segment(name, "ServiceAccount name")
        return f"{cls._namespace_path(namespace)}/serviceaccounts/{name}"

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", self._sa_path(namespace, name))

    def annotate_service_account(
        self, namespace: str, name: str, key: str, value: str, resource_version: str
    ) -> None:
        """Set one annotation, only on the version read (409 when it changed since)."""
        self.request(
            "PATCH",
            self._sa_path(namespace, name),
            {"metadata": {"resourceVersion": resource_version, "annotations": {key: value}}},
            content_type="application/merge-patch+json",
        )

    def remove_service_account_annotation(
        self, namespace: str, name: str, key: str, value: str
    ) -> bool:
        """Remove one annotation if it still holds `value`; whether it did."""
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        # The path is built (and the names checked) first: a 422 below is the test's.
        url_path = self._sa_path(namespace, name)
        try:
            self.request(
                "PATCH",
                url_path,
                [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
                content_type="application/json-patch+json",
            )
        except KubeError as exc:
            if exc.status == 422:  # the test failed: it holds something else now
                return False
            raise
        return True
