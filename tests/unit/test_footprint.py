"""Watch events reach kopf's queues without managedFields (provisioner/runtime/footprint.py)."""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import tracemalloc
from asyncio import sslproto
from typing import Any

import pytest
from kopf._cogs.clients import watching
from kopf._core.reactor import queueing

from provisioner.runtime import footprint


def _body(n: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "cloud.provisioner.dev/v1alpha1",
        "kind": "S3Bucket",
        "metadata": {
            "name": f"b{n}",
            "namespace": "team-a",
            "uid": f"uid-{n}",
            "labels": {"team": "a"},
            "finalizers": ["cloud.provisioner.dev/finalizer"],
            "managedFields": [
                {
                    "manager": manager,
                    "operation": "Update",
                    "apiVersion": "cloud.provisioner.dev/v1alpha1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        f"f:{field}": {f"f:{k}": {} for k in "abcdefghijklmnop"}
                        for field in ("spec", "status", "metadata")
                    },
                }
                for manager in ("kubectl", "kopf", "provisioner")
            ],
        },
        "spec": {"region": "us-east-1", "versioning": True},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_lean_leaves_out_managed_fields_and_nothing_else() -> None:
    event: dict[str, Any] = {"type": "MODIFIED", "object": _body()}
    expected = copy.deepcopy(event)
    del expected["object"]["metadata"]["managedFields"]
    assert footprint.lean(event) == expected


def test_lean_passes_what_is_not_an_object_event() -> None:
    for other in (watching.Bookmark.LISTED, {"type": "BOOKMARK"}, {"object": None}, None):
        assert footprint.lean(other) is other


def test_installed_for_every_watcher_once() -> None:
    original, buffer = watching.infinite_watch, sslproto.SSLProtocol.max_size
    try:
        footprint.install()
        footprint.install()
        installed = watching.infinite_watch
        assert getattr(installed, "lean", False)
        assert installed.__wrapped__ is original or getattr(original, "lean", False)  # type: ignore[attr-defined]
        # kopf's watcher looks the generator up on the module each time it starts a watch.
        assert queueing.watching is watching
    finally:
        watching.infinite_watch = original
        sslproto.SSLProtocol.max_size = buffer


def test_a_tls_connection_reads_into_64_kib() -> None:
    original, buffer = watching.infinite_watch, sslproto.SSLProtocol.max_size
    loop = asyncio.new_event_loop()
    try:
        footprint.install()
        protocol = sslproto.SSLProtocol(
            loop, asyncio.Protocol(), ssl.create_default_context(), loop.create_future()
        )
        assert len(protocol.get_buffer(-1)) == 64 * 1024 < buffer
    finally:
        watching.infinite_watch = original
        sslproto.SSLProtocol.max_size = buffer
        loop.close()


def test_wrapped_stream_yields_lean_events_in_order() -> None:
    events = [watching.Bookmark.LISTED] + [{"type": "ADDED", "object": _body(n)} for n in range(3)]

    async def fake_watch(**_: Any) -> Any:
        for event in events:
            yield event

    async def read() -> list[Any]:
        return [e async for e in footprint._wrap(fake_watch)(settings=None)]

    seen = asyncio.run(read())
    assert seen[0] is watching.Bookmark.LISTED
    assert [e["object"]["metadata"]["name"] for e in seen[1:]] == ["b0", "b1", "b2"]
    assert all("managedFields" not in e["object"]["metadata"] for e in seen[1:])


def test_a_queued_body_holds_less_than_half_the_memory() -> None:
    text = json.dumps(_body())
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        whole = [json.loads(text) for _ in range(200)]
        full = tracemalloc.get_traced_memory()[0] - before
        del whole
        before = tracemalloc.get_traced_memory()[0]
        leaned = [footprint.lean({"object": json.loads(text)}) for _ in range(200)]
        lean = tracemalloc.get_traced_memory()[0] - before
        del leaned
    finally:
        tracemalloc.stop()
    assert lean < full / 2, (lean, full)


def test_kopf_connections_leave_room_for_requests_beside_every_watch() -> None:
    from provisioner.config import Settings
    from provisioner.runtime.kopf_setup import API_REQUESTS_IN_FLIGHT, api_connection_limit

    assert API_REQUESTS_IN_FLIGHT == 8
    # Four kinds and peering in every namespace, CloudAccounts and namespaces once, plus 8.
    assert api_connection_limit(Settings()) == 15
    assert api_connection_limit(Settings(namespaces=["a"])) == 15
    assert api_connection_limit(Settings(namespaces=[f"team-{i}" for i in range(30)])) == 160
    # A glob hides how many namespaces will be watched: no limit.
    assert api_connection_limit(Settings(namespaces=["team-*"])) == 0


def test_a_kopf_without_the_generator_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(watching, "infinite_watch")
    with pytest.raises(RuntimeError) as refused:
        footprint.install()
    assert str(refused.value) == (
        "kopf has no watching.infinite_watch: managedFields cannot be left out"
    )
