"""Against LocalStack's free edition, which has no RDS: a clear condition, no retry storm."""

from __future__ import annotations

import pytest

from tests.conftest import TEST_CLOUD
from tests.helpers import apply, condition, events, wait_condition, wait_for, wait_gone

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(TEST_CLOUD != "localstack", reason="runs with `make test-localstack`"),
]


def test_database_without_rds_fails_clearly_and_deletes(kube, operator, namespace):
    apply(
        kube,
        namespace,
        "apiVersion: cloud.provisioner.dev/v1alpha1\nkind: DatabaseInstance\n"
        "metadata:\n  name: nords\nspec: {engine: postgres, instanceClass: db.t3.micro}\n",
    )
    cr = wait_condition(kube, "dbi", namespace, "nords", "Synced", "False", "InvalidSpec")
    message = condition(cr, "Synced")["message"]
    assert "does not offer" in message, message
    transition = condition(cr, "Synced")["lastTransitionTime"]
    warnings = wait_for(
        lambda: [e for e in events(kube, namespace, "nords") if e["reason"] == "InvalidSpec"],
        what="an InvalidSpec Event",
    )
    # No retry storm: one Event, and the condition does not flap.
    assert len(warnings) == 1 and warnings[0].get("count", 1) == 1
    assert condition(cr, "Synced")["lastTransitionTime"] == transition
    kube.kubectl("delete", "dbi", "nords", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "nords")
