"""The few Kubernetes API calls the operator makes itself (kopf makes the rest).

Plain dicts in and out over urllib3 (no client library, no model (de)serialisation), so a
call costs little CPU and memory; credentials as `provisioner.kubelogin` finds them.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode

import urllib3

from provisioner import API_VERSION, kubelogin
from provisioner.kinds import PLURALS


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


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
        """Returns the decoded response; None for a 404."""
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
    def _secret_path(namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{namespace}/secrets"
        return f"{base}/{name}" if name else base

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", self._secret_path(namespace, name))

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return self.request("POST", self._secret_path(namespace), body)

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.request("PUT", self._secret_path(namespace, name), body)

    def delete_secret(self, namespace: str, name: str, uid: str | None = None) -> None:
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            self.request("DELETE", self._secret_path(namespace, name), body)
        except KubeError as exc:
            if exc.status != 409:  # uid precondition failed: it is someone else's now
                raise

    # Events -----------------------------------------------------------------------

    def post_event(
        self, body: dict[str, Any], type_: str, reason: str, message: str, component: str
    ) -> None:
        """A core/v1 Event on the object, as `kubectl describe` shows it (for a
        cluster-scoped object, in the namespace `default`, as kubectl's own are)."""
        meta = body["metadata"]
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
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
        self.request("POST", f"/api/v1/namespaces/{namespace}/events", event)

    # Custom resources -----------------------------------------------------------

    @staticmethod
    def _cr_path(kind: str, namespace: str, name: str) -> str:
        return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURALS[kind]}/{name}"

    def get_resource(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", self._cr_path(kind, namespace, name))

    def delete_resource(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete it if it still is the object `uid` (a 409 otherwise, ignored)."""
        try:
            self.request(
                "DELETE", self._cr_path(kind, namespace, name), {"preconditions": {"uid": uid}}
            )
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

    @staticmethod
    def _sa_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"

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
        try:
            self.request(
                "PATCH",
                self._sa_path(namespace, name),
                [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
                content_type="application/json-patch+json",
            )
        except KubeError as exc:
            if exc.status == 422:  # the test failed: it holds something else now
                return False
            raise
        return True
