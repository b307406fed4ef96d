"""The periodic resync describes the databases that come due together in one call per batch
(DescribeDBInstances with a db-instance-id filter of up to 100), and still finds and corrects
drift from that answer."""

from __future__ import annotations

import pytest

from provisioner_dev.processes import free_port
from tests.e2e.test_observability import sample, scrape
from tests.helpers import apply, events, manifests, wait_for, wait_ready

pytestmark = pytest.mark.e2e

DB = "{engine: postgres, instanceClass: db.t3.micro, deletionPolicy: Delete}"


def test_resync_observes_databases_in_batches_and_corrects_drift(
    kube, aws, own_namespace, start_operator
):
    port = free_port()
    # A resync every 10 s: its batch window is 1 s.
    start_operator(args=[f"--metrics-port={port}", "--resync-seconds=10"])
    names = [f"db{i}" for i in range(8)]
    apply(kube, own_namespace, manifests([("DatabaseInstance", n, DB) for n in names]))
    idents = {
        n: wait_ready(kube, "dbi", own_namespace, n, timeout=120)["status"]["externalName"]
        for n in names
    }

    def counts(samples: dict[str, float]) -> tuple[float, float, float]:
        return (
            sample(samples, "provisioner_resync_batched_total", kind="DatabaseInstance"),
            sample(samples, "provisioner_resync_batches_total", kind="DatabaseInstance"),
            sample(
                samples,
                "provisioner_aws_calls_total",
                service="rds",
                operation="DescribeDBInstances",
            ),
        )

    described0, batches0, calls0 = counts(scrape(port))
    # Two periods' worth: every database resynced about twice.
    after = wait_for(
        lambda: (c := counts(scrape(port)))[0] - described0 >= 2 * len(names) and c,
        timeout=90,
        what="two rounds of batched resyncs",
    )
    described, batches, calls = (
        a - b for a, b in zip(after, (described0, batches0, calls0), strict=True)
    )
    print(
        f"\n{described:.0f} resync observations of databases from {batches:.0f} batches; "
        f"DescribeDBInstances calls meanwhile: {calls:.0f}"
    )
    # Without batches it would be one call per observation.
    assert calls <= described / 2, (described, batches, calls)

    # Drift behind the operator's back is still seen from a batch's answer and corrected.
    ident = idents["db3"]
    aws.rds.modify_db_instance(
        DBInstanceIdentifier=ident, BackupRetentionPeriod=30, ApplyImmediately=True
    )

    def retention() -> int:
        found = aws.rds.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
        return int(found["BackupRetentionPeriod"])

    assert retention() == 30
    wait_for(lambda: retention() == 7, timeout=60, what="the drift to be corrected")
    drifted = [e for e in events(kube, own_namespace, "db3") if e["reason"] == "Drifted"]
    assert drifted and "backupRetentionDays" in drifted[-1]["message"], drifted
