"""The Kubernetes API as plain JSON, for bench/ and the dev harness.

The kubernetes client's transport (TLS, client certificates, tokens from a kubeconfig) with
plain dicts in and out: no model (de)serialisation, so many calls cost little CPU.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

# Answers that mean "the API server is not there right now" (e.g. being restarted).
TRANSIENT_STATUS = {0, 502, 503, 504}


class KubeJson:
    def __init__(
        self, kubeconfig: str | Path, pool_size: int = 32, transient_seconds: float = 0.0
    ) -> None:
        """`transient_seconds`: how long to retry refused connections and 5xx before giving up."""
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
        config.connection_pool_maxsize = pool_size
        self.client = kubernetes.client.ApiClient(config)
        self.transient_seconds = transient_seconds

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 60,
    ) -> tuple[int, bytes]:
        """(HTTP status, body) of one request; 0 when no answer came."""
        deadline = time.monotonic() + self.transient_seconds
        attempt = 0
        while True:
            status, data = self._once(method, path, body, content_type, accept, timeout)
            if status not in TRANSIENT_STATUS or time.monotonic() >= deadline:
                return status, data
            attempt += 1
            time.sleep(min(2.0, 0.2 * attempt))

    def _once(
        self, method: str, path: str, body: Any, content_type: str, accept: str, timeout: float
    ) -> tuple[int, bytes]:
        method, url, headers, body, post = self.client.param_serialize(
            method,
            path,
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(method, url, headers, body, post, _request_timeout=timeout)
        except kubernetes.client.exceptions.ApiException as exc:
            return int(exc.status or 0), str(exc.body or exc.reason).encode()
        except urllib3.exceptions.HTTPError as exc:
            return 0, str(exc).encode()
        return resp.status, resp.read()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        """The decoded answer; RuntimeError for anything but 2xx."""
        status, data = self.request(method, path, body, **kw)
        if status >= 300 or status == 0:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data) if data else {}

    def get(self, path: str) -> dict[str, Any] | None:
        """GET, or None for a 404."""
        status, data = self.request("GET", path)
        if status == 404:
            return None
        if status >= 300 or status == 0:
            raise RuntimeError(f"GET {path}: {status} {data[:300]!r}")
        return json.loads(data)

    def list_items(self, path: str) -> list[dict[str, Any]]:
        return self.json("GET", path).get("items") or []

    def text(self, path: str) -> str:
        """A plain-text endpoint such as /metrics."""
        status, data = self.request("GET", path, accept="text/plain")
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
        return data.decode(errors="replace")

    def watch(
        self, path: str, resource_version: str, timeout_seconds: int = 60
    ) -> Iterator[dict[str, Any]]:
        """The events of one WATCH of a collection from `resource_version` (with bookmarks),
        as they come, until the API server ends it (after `timeout_seconds`); RuntimeError
        when it is refused. An ERROR event (e.g. 410: that version is gone) is yielded too."""
        query = (
            f"watch=1&allowWatchBookmarks=true&resourceVersion={resource_version}"
            f"&timeoutSeconds={timeout_seconds}"
        )
        method, url, headers, _, _ = self.client.param_serialize(
            "GET",
            f"{path}?{query}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(
                method, url, headers, _request_timeout=(10, timeout_seconds + 30)
            )
        except kubernetes.client.exceptions.ApiException as exc:
            raise RuntimeError(f"WATCH {path}: {exc.status} {exc.reason}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise RuntimeError(f"WATCH {path}: {exc}") from None
        stream = resp.response
        try:
            if resp.status != 200:
                raise RuntimeError(f"WATCH {path}: {resp.status} {stream.read()[:300]!r}")
            pending = b""
            for chunk in stream.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except urllib3.exceptions.HTTPError as exc:
            raise RuntimeError(f"WATCH {path}: {exc}") from None
        finally:
            stream.close()  # a watch connection is not reused, whether read to its end or not
            stream.release_conn()
