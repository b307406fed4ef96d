"""The aws-like cloud's restores, read replicas and promotions, as AWS shows them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from provisioner_dev.awslike import AwsLikeProxy
from tests.cloud.test_awslike import (
    DURATIONS,
    SCALE,
    client,
    create_db,
    db_states,
    error_of,
    name,
)
from tests.helpers import wait_for

pytestmark = pytest.mark.cloud

# Real seconds at SCALE for the states played here.
MORE = {"rds.restore": 1.5, "rds.replica": 1.5, "rds.promote": 1.5, "rds.snapshot": 3.0}


@pytest.fixture(scope="module")
def proxy(moto_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsLikeProxy]:
    more = [f"--duration={k}={v * SCALE:g}" for k, v in MORE.items()]
    proxy = AwsLikeProxy(
        upstream=moto_url,
        args=[f"--time-scale={SCALE}", *DURATIONS, *more],
        log=tmp_path_factory.mktemp("awslike-sources") / "proxy.log",
        seed=7,
    )
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_a_restore_waits_for_its_snapshot_then_is_creating(proxy):
    rds, ident = client("rds", proxy.url), name("db")
    create_db(rds, ident)
    db_states(rds, ident, "available")
    snapshot = f"{ident}-final-1"
    rds.delete_db_instance(
        DBInstanceIdentifier=ident, FinalDBSnapshotIdentifier=snapshot, SkipFinalSnapshot=False
    )
    restored = name("back")

    def restore():
        return rds.restore_db_instance_from_db_snapshot(
            DBInstanceIdentifier=restored, DBSnapshotIdentifier=snapshot
        )

    assert error_of(restore) == ("InvalidDBSnapshotState", 400)

    def snapshot_status() -> str:
        return rds.describe_db_snapshots(DBSnapshotIdentifier=snapshot)["DBSnapshots"][0]["Status"]

    wait_for(lambda: snapshot_status() == "available", timeout=20, what="snapshot available")
    assert restore()["DBInstance"]["DBInstanceStatus"] == "creating"
    seen = db_states(rds, restored, "available")
    assert [s for s, _ in seen][:2] == ["creating", "backing-up"]


def test_a_point_in_time_restore_and_a_replica_are_creating_then_available(proxy):
    rds, source = client("rds", proxy.url), name("src")
    create_db(rds, source)
    db_states(rds, source, "available")
    clone = name("pit")
    rds.restore_db_instance_to_point_in_time(
        SourceDBInstanceIdentifier=source,
        TargetDBInstanceIdentifier=clone,
        UseLatestRestorableTime=True,
    )
    assert [s for s, _ in db_states(rds, clone, "available")][:1] == ["creating"]
    replica = name("rep")
    answer = rds.create_db_instance_read_replica(
        DBInstanceIdentifier=replica, SourceDBInstanceIdentifier=source
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "creating"
    seen = db_states(rds, replica, "available")
    assert seen[-1][1]["ReadReplicaSourceDBInstanceIdentifier"] == source


def test_a_promotion_is_modifying_then_the_replica_names_no_source(proxy):
    rds, source = client("rds", proxy.url), name("src")
    create_db(rds, source)
    db_states(rds, source, "available")
    replica = name("rep")
    rds.create_db_instance_read_replica(
        DBInstanceIdentifier=replica, SourceDBInstanceIdentifier=source
    )
    db_states(rds, replica, "available")
    rds.promote_read_replica(DBInstanceIdentifier=replica)
    assert error_of(rds.promote_read_replica, DBInstanceIdentifier=replica) == (
        "InvalidDBInstanceState",
        400,
    )
    seen = db_states(rds, replica, "available")
    assert [s for s, _ in seen] == ["modifying", "available"]
    assert seen[0][1]["ReadReplicaSourceDBInstanceIdentifier"] == source  # while promoting
    assert "ReadReplicaSourceDBInstanceIdentifier" not in seen[-1][1]
    found = rds.describe_db_instances(DBInstanceIdentifier=source)["DBInstances"][0]
    assert replica not in found.get("ReadReplicaDBInstanceIdentifiers", [])
