"""The operator's own Kubernetes API paths: every segment checked and encoded.

A name that no Kubernetes object can have (`..`, `/`, `%2F`, uppercase, empty, too long) is
refused with InvalidName before any request; a valid one reaches the server as exactly one
path segment. The server here is a real HTTP server on loopback that records what it is
asked, standing in for the API server.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from provisioner.kube import login as kubelogin
from provisioner.kube.client import InvalidName, Kube, KubeError, event_name, valid_name


class Recorder(BaseHTTPRequestHandler):
    """Records (method, raw path, JSON body) and answers 404 (GET) or the body back (201)."""

    seen: list[tuple[str, str, object]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, body))
        status, out = (404, {}) if self.command == "GET" else (201, body or {})
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def recording() -> Iterator[tuple[Kube, list[tuple[str, str, object]]]]:
    seen: list[tuple[str, str, object]] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    creds = kubelogin.Credentials(server=f"http://127.0.0.1:{httpd.server_address[1]}")
    try:
        yield Kube(pool_size=2, creds=creds), seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server(recording) -> tuple[Kube, list[tuple[str, str, object]]]:
    """The recording server, with nothing recorded yet (requests are answered before the
    client returns, so nothing of an earlier test arrives late)."""
    recording[1].clear()
    return recording


BAD_NAMES = [
    "../../victim/secrets/db",
    "..",
    ".",
    "a/b",
    "a%2Fb",
    "a%2F..%2F..%2Fx",
    "Orders",
    "",
    "a" * 254,
    "-orders",
    "orders-",
    "a..b",
    "orders?watch=true",
    "orders#x",
    "orders\n",
    "ordérs",
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_secret_names_are_refused_before_any_request(server, bad):
    kube, seen = server
    calls = [
        lambda: kube.get_secret("team-a", bad),
        lambda: kube.replace_secret("team-a", bad, {"metadata": {"name": bad}}),
        lambda: kube.delete_secret("team-a", bad, uid="u"),
        lambda: kube.get_service_account("team-a", bad),
        lambda: kube.annotate_service_account("team-a", bad, "k", "v", "1"),
        lambda: kube.remove_service_account_annotation("team-a", bad, "k", "v"),
        lambda: kube.get_resource("Queue", "team-a", bad),
        lambda: kube.delete_resource("Queue", "team-a", bad, "u"),
        lambda: kube.patch_status("Queue", "team-a", bad, {}),
    ]
    for call in calls:
        with pytest.raises(InvalidName) as refused:
            call()
        error = refused.value
        assert isinstance(error, KubeError)
        assert (error.status, error.reason) == (422, "Invalid")
        assert "must be a lowercase RFC 1123 subdomain" in error.message
        assert "\n" not in str(error)
        shown = bad if len(bad) <= 80 else bad[:77]
        assert json.dumps(shown)[:-1] in error.message  # the value is named
    assert seen == []


@pytest.mark.parametrize("bad", ["..", "team/a", "Team-a", "", "a" * 64, "team.a", "%2e%2e"])
def test_invalid_namespaces_are_refused_before_any_request(server, bad):
    kube, seen = server
    for call in [
        lambda: kube.get_secret(bad, "db"),
        lambda: kube.create_secret(bad, {"metadata": {"name": "db"}}),
        lambda: kube.get_service_account(bad, "worker"),
        lambda: kube.get_resource("Topic", bad, "orders"),
    ]:
        with pytest.raises(InvalidName) as refused:
            call()
        assert "must be a lowercase RFC 1123 label" in refused.value.message
    assert seen == []


def test_valid_names_reach_the_server_as_one_segment_each(server):
    kube, seen = server
    longest = ".".join(["a" * 63] * 4)[:253].rstrip(".")
    assert kube.get_secret("team-a", "orders.connection-1") is None
    assert kube.get_secret("t" * 63, longest) is None
    assert kube.get_service_account("team-a", "worker") is None
    assert kube.get_resource("DatabaseInstance", "team-a", "orders") is None
    kube.create_secret("team-a", {"metadata": {"name": "db"}})
    assert [(m, p) for m, p, _ in seen] == [
        ("GET", "/api/v1/namespaces/team-a/secrets/orders.connection-1"),
        ("GET", f"/api/v1/namespaces/{'t' * 63}/secrets/{longest}"),
        ("GET", "/api/v1/namespaces/team-a/serviceaccounts/worker"),
        ("GET", "/apis/cloud.provisioner.dev/v1beta1/namespaces/team-a/databaseinstances/orders"),
        ("POST", "/api/v1/namespaces/team-a/secrets"),
    ]


def test_a_path_built_elsewhere_cannot_climb_out(server):
    """A last line for paths formatted by callers: no dot segment, query or encoded slash."""
    kube, seen = server
    for path in [
        "/apis/cloud.provisioner.dev/v1alpha1/cloudaccounts/../../../api/v1/namespaces/v/secrets/s",
        "/api/v1/namespaces/%2e%2e/secrets",
        "/api/v1/namespaces/a%2Fb/secrets",
        "/api/v1/namespaces/./secrets",
        "/api/v1/namespaces/a/secrets?labelSelector=x",
    ]:
        with pytest.raises(InvalidName):
            kube.request("GET", path)
    assert seen == []
    assert kube.request("GET", "/apis/cloud.provisioner.dev/v1alpha1/cloudaccounts/prod") is None
    assert [p for _, p, _ in seen] == ["/apis/cloud.provisioner.dev/v1alpha1/cloudaccounts/prod"]


def test_validity_is_kubernetes_own_rule():
    assert valid_name("a") and valid_name("a" * 253) and valid_name("a-b.c-d.e")
    assert not valid_name("a" * 254) and not valid_name("a.-b") and not valid_name("a_b")
    assert valid_name("a" * 63, "label") and not valid_name("a" * 64, "label")
    assert not valid_name("a.b", "label") and not valid_name(None)


# Event names (the object's name and a random suffix) -------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "orders",
        "a" * 236,
        "a" * 237,
        "a" * 253,
        "a" * 235 + ".b" * 9,  # the cut falls right after a '.'
        "a" * 234 + "-" * 5 + "b" * 14,  # ... inside a run of '-'
        ".".join(["b" * 63] * 4)[:253],
    ],
)
def test_event_names_are_always_valid(server, name):
    kube, seen = server
    assert valid_name(name)
    body = {"kind": "Queue", "metadata": {"name": name, "namespace": "team-a", "uid": "u"}}
    kube.post_event(body, "Normal", "Created", "made", "provisioner")
    ((method, path, event),) = seen
    assert (method, path) == ("POST", "/api/v1/namespaces/team-a/events")
    assert isinstance(event, dict)
    posted = event["metadata"]["name"]
    assert len(posted) <= 253 and valid_name(posted), posted
    prefix, _, suffix = posted.rpartition(".")
    assert re.fullmatch(r"[0-9a-f]{16}", suffix)
    assert name.startswith(prefix) and len(prefix) >= min(len(name), 230)
    assert event["involvedObject"]["name"] == name
    assert event_name(name) != event_name(name)  # unique per Event
