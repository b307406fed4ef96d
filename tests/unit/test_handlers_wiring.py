"""The kopf wiring: which handlers each setting registers, under which ids, and that a handler
registered for several causes is one object (kopf runs it once for an event they all match)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from provisioner import config
from provisioner.kinds.registry import KINDS
from provisioner.runtime import handlers, sharding

KUBE = SimpleNamespace(creds=SimpleNamespace(namespace="ops"))


def parse(*argv: str) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(list(argv)))


def wired(settings: config.Settings, aws: bool = True) -> list[Any]:
    registry = kopf.OperatorRegistry()
    reconciler: Any = SimpleNamespace(
        kube=KUBE,
        settings=settings,
        directory=object() if settings.accounts else None,
        classes=object() if settings.accounts else None,
    )
    fake_aws: Any = SimpleNamespace(
        budget=SimpleNamespace(set_share=lambda share: None),
        sessions=SimpleNamespace(forget=lambda name: None),
    )
    handlers.register(registry, reconciler, settings, fake_aws if aws else None)
    return [
        *registry._activities.get_all_handlers(),
        *registry._changing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]


def ids(found: list[Any]) -> set[str]:
    return {h.id for h in found}


def test_each_kind_reconciles_and_finalizes_with_one_handler_object():
    found = wired(parse())
    reconcile = [h for h in found if h.id == "reconcile"]
    assert len(reconcile) == 3 * len(KINDS)  # resume, create, update
    assert len({id(h.fn) for h in reconcile}) == 1
    assert len([h for h in found if h.id == "finalize"]) == len(KINDS)
    assert {"startup", "cleanup"} <= ids(found)
    assert "login" in ids(found)


def test_cloud_accounts_managed_cluster_wide_only():
    cluster_wide = ids(wired(parse()))
    assert {"cloudaccount-watch", "namespace-watch", "release"} <= cluster_wide
    assert "cloudaccounts-check" in cluster_wide
    namespaced = ids(wired(parse("--namespace=a")))
    assert {"cloudaccount-watch", "namespace-watch"} <= namespaced
    assert "release" not in namespaced
    assert "release" not in ids(wired(parse(), aws=False))
    assert "cloudaccount-watch" not in ids(wired(parse("--accounts=off")))


def test_sharded_replicas_hand_over(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POD_NAME", "pod-a")
    assert "handover" in ids(wired(parse("--sharding=on")))
    assert "handover" not in ids(wired(parse()))


def test_a_resource_is_handed_over_unless_labelled_with_this_shard_alone():
    settings = parse("--sharding=on", "--shard-name=a")
    reconciler: Any = SimpleNamespace(kube=KUBE)
    built = handlers.build(reconciler, settings)
    mine = {"metadata": {"labels": {sharding.SHARD_LABEL: "a"}}}
    draining = {"metadata": {"labels": {sharding.SHARD_LABEL: "a", sharding.DRAIN_LABEL: "1"}}}
    assert not built.handed_over(mine)
    assert built.handed_over(draining)
    assert built.handed_over({"metadata": {}})
    assert built.scheduler.owns is not None and built.scheduler.owns(mine)
    unsharded = handlers.build(reconciler, parse())
    assert not unsharded.handed_over({"metadata": {}})
    assert unsharded.scheduler.owns is None
