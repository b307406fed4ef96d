"""Sharding's pure parts: the consistent-hash ring, the Lease clock, the settings checks, and
kopf's last-handled configuration without the shard labels."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from provisioner import config
from provisioner.runtime import sharding
from provisioner.runtime.kopf_setup import _without_shard_labels

KEYS = [sharding.key("Queue", f"ns-{i % 7}", f"q-{i}") for i in range(3000)]


def test_ring_spreads_keys_roughly_evenly():
    ring = sharding.Ring(["a", "b", "c"])
    spread = Counter(ring.owner(k) for k in KEYS)
    assert set(spread) == {"a", "b", "c"}
    assert max(spread.values()) / min(spread.values()) < 1.5, spread


def test_ring_moves_only_the_joiners_share():
    before = sharding.Ring(["a", "b", "c"])
    after = sharding.Ring(["a", "b", "c", "d"])
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    # Only keys that now belong to the newcomer move, about a quarter of them.
    assert all(after.owner(k) == "d" for k in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.35


def test_ring_moves_only_the_leavers_keys():
    before = sharding.Ring(["a", "b", "c"])
    after = sharding.Ring(["a", "b"])
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    assert all(before.owner(k) == "c" for k in moved)
    assert all(after.owner(k) == before.owner(k) for k in KEYS if before.owner(k) != "c")


def test_ring_is_the_same_in_every_process():
    # sha256, not Python's salted hash(): two replicas must agree on every owner.
    assert sharding.Ring(["x", "y"]).owner("Queue/default/q") == sharding.Ring(["y", "x"]).owner(
        "Queue/default/q"
    )
    assert sharding.Ring([]).owner("anything") is None


def test_owns_needs_the_shard_label_and_no_drain():
    assert sharding.owns({sharding.SHARD_LABEL: "a"}, "a")
    assert not sharding.owns({sharding.SHARD_LABEL: "b"}, "a")
    assert not sharding.owns({sharding.SHARD_LABEL: "a", sharding.DRAIN_LABEL: "true"}, "a")
    assert not sharding.owns(None, "a")


def test_lease_clock_counts_from_when_a_renewal_was_seen():
    clock = sharding.LeaseClock()
    assert clock.observe("l", "t1", 100.0) == 100.0
    assert clock.observe("l", "t1", 130.0) == 100.0  # unchanged: first seen at 100
    assert clock.observe("l", "t2", 131.0) == 131.0  # renewed
    clock.forget_except([])
    assert clock.observe("l", "t2", 200.0) == 200.0


def parse(*argv: str) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(list(argv)))


def test_sharding_settings(monkeypatch):
    monkeypatch.setenv("POD_NAME", "provisioner-7d9f-abcde")
    settings = parse("--sharding=on")
    assert settings.sharding and settings.shard_name == "provisioner-7d9f-abcde"
    assert parse("--sharding=on", "--shard-name=x1").shard_name == "x1"
    assert not parse().sharding


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sharding=on", "--peering=p"], "exclude each other"),
        (["--sharding=on", "--namespace=team-*"], "exact --namespace names"),
        (["--sharding=on", "--shard-name=Upper"], "shard name 'Upper'"),
        (["--sharding=on", "--shard-name=-x"], "shard name '-x'"),
        (["--sharding=on", "--shard-name=a", "--shard-lease-seconds=2"], "at least 3"),
    ],
)
def test_sharding_settings_refused_in_one_line(argv, message):
    with pytest.raises(config.ConfigError, match=message) as info:
        parse(*argv)
    assert "\n" not in str(info.value)


def test_last_handled_configuration_leaves_out_the_shard_labels():
    essence = {
        "spec": {"a": 1},
        "metadata": {"labels": {sharding.SHARD_LABEL: "a", sharding.DRAIN_LABEL: "true"}},
    }
    assert _without_shard_labels(essence) == {"spec": {"a": 1}}
    kept = {"spec": {}, "metadata": {"labels": {"team": "x", sharding.SHARD_LABEL: "b"}}}
    assert _without_shard_labels(kept) == {
        "spec": {},
        "metadata": {"labels": {"team": "x"}},
    }
    untouched = {"spec": {}, "metadata": {"labels": {"team": "x"}}}
    assert _without_shard_labels(untouched) is untouched


class FakeLeases:
    """A Kube stand-in answering the Lease list with what `renewals` holds."""

    def __init__(self) -> None:
        self.renewals: dict[str, str] = {}

    def request(self, method: str, path: str, body=None, **_: object):
        assert method == "GET" and path.endswith("/leases")
        return {
            "items": [
                {
                    "metadata": {"name": f"ring-shard-{m}"},
                    "spec": {"holderIdentity": m, "renewTime": t, "leaseDurationSeconds": 15},
                }
                for m, t in self.renewals.items()
            ]
        }


def test_a_member_is_dead_after_its_lease_duration_of_watching_without_a_renewal():
    kube = FakeLeases()
    shards = sharding.Shards(kube, "ops", "ring", "a", lease_seconds=15).sharder
    kube.renewals = {"a": "t0", "b": "t0"}
    assert shards.live_members(100.0)[0] == {"a", "b"}
    for now in range(101, 115):
        assert "b" in shards.live_members(float(now))[0]
    kube.renewals["b"] = "t1"  # renewed: alive for another 15 s from now
    assert shards.live_members(116.0)[0] == {"a", "b"}
    for now in range(117, 131):
        assert "b" in shards.live_members(float(now))[0]
    alive, dead, _ = shards.live_members(131.5)
    assert alive == {"a"} and dead == {"b"}  # itself is never dead to itself


def test_time_the_sharder_could_not_look_does_not_count():
    kube = FakeLeases()
    shards = sharding.Shards(kube, "ops", "ring", "a", lease_seconds=15).sharder
    kube.renewals = {"a": "t0", "b": "t0"}
    shards.live_members(100.0)
    # The API server was away for a minute: b had no chance to renew either.
    assert shards.live_members(160.0)[0] == {"a", "b"}
    for now in range(161, 175):
        assert "b" in shards.live_members(float(now))[0]
    assert "b" in shards.live_members(175.0)[1]


class FakeRing(FakeLeases):
    """Also the sharder Lease, held by `sharder` and renewed at `sharder_renewed`."""

    def __init__(self) -> None:
        super().__init__()
        self.sharder, self.sharder_renewed = "a", "s0"
        self.lists = 0

    def request(self, method: str, path: str, body=None, **kw: object):
        if path.endswith("/leases/ring-sharder"):
            if method == "PUT":
                self.sharder = body["spec"]["holderIdentity"]
                self.sharder_renewed = body["spec"]["renewTime"]
                return body
            spec = {"holderIdentity": self.sharder, "renewTime": self.sharder_renewed}
            return {
                "metadata": {"name": "ring-sharder"},
                "spec": spec | {"leaseDurationSeconds": 15},
            }
        self.lists += 1
        return super().request(method, path, body, **kw)


def test_the_replicas_that_die_with_the_sharder_move_one_lease_duration_later():
    """Replica b times the members' Leases as soon as the sharder misses its renewals: when
    it takes over, 15 s after a and c stopped, they are dead 15 s after it first saw them
    silent, not 15 s after it became the sharder."""
    kube = FakeRing()
    shards = sharding.Shards(kube, "ops", "ring", "b", lease_seconds=15).sharder
    kube.renewals = {"a": "t0", "b": "t0", "c": "t0"}
    assert shards.lead(100.0) is False
    assert kube.lists == 0  # a live sharder: the members are not listed
    for now in range(101, 115):  # a (the sharder) and c stop renewing; b goes on
        kube.renewals["b"] = f"t{now}"
        assert shards.lead(float(now)) is False
    assert kube.lists > 0
    kube.renewals["b"] = "t115"
    assert shards.lead(115.0) is True and kube.sharder == "b"
    for now in range(115, 121):  # the sharder's rounds, every second
        kube.renewals["b"] = f"t{now}"
        assert shards.live_members(float(now))[1] == set()  # first seen silent at 106
    _, dead, _ = shards.live_members(121.5)
    assert dead == {"a", "c"}


def test_a_sharder_renewing_again_stops_the_members_being_timed():
    kube = FakeRing()
    shards = sharding.Shards(kube, "ops", "ring", "b", lease_seconds=15).sharder
    kube.renewals = {"a": "t0", "b": "t0"}
    for now in range(100, 108):
        shards.lead(float(now))
    listed = kube.lists
    assert listed > 0
    kube.sharder_renewed = "s1"  # the sharder is back
    for now in range(108, 113):
        assert shards.lead(float(now)) is False
    assert kube.lists == listed
