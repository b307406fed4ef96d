"""Stage guardrails: what keeps a pass from acting (the paused annotation, a generation
refused for good) and the namespace on its way out that overrides a pause."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.kinds import registry as kinds
from provisioner.kube.client import KubeError
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.reconciler import guardrails
from provisioner.reconciler.outcome import Verdict
from tests.unit.fakes import FakeKube

NS = "team-a"


def resource(
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    generation: int = 2,
) -> Resource:
    body = {
        "kind": "Queue",
        "metadata": {
            "namespace": NS,
            "name": "q",
            "uid": "uid-q",
            "generation": generation,
            "annotations": annotations or {},
        },
        "spec": {},
        "status": status or {},
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def synced(status: str, reason: str, gen: int) -> dict[str, Any]:
    return {"type": cond.SYNCED, "status": status, "reason": reason, "observedGeneration": gen}


# -- paused ------------------------------------------------------------------------------


def test_paused_is_a_synced_false_that_claims_no_generation():
    result = guardrails.paused(resource(annotations={annotation_keys.PAUSED: "true"}))
    assert [(c.type, c.status, c.reason) for c in result.conditions] == [
        (cond.SYNCED, False, cond.PAUSED)
    ]
    assert annotation_keys.PAUSED in result.conditions[0].message
    assert result.verdict is Verdict.PAUSED
    assert result.for_generation is False
    assert result.requeue_after is None  # unpausing is a change: its handler runs then
    assert result.events == [] and result.fields == {}


@pytest.mark.parametrize(
    ("value", "paused"),
    [("true", True), ("True", True), ("yes", True), ("1", True), ("false", False), ("", False)],
)
def test_what_counts_as_paused(value, paused):
    assert resource(annotations={annotation_keys.PAUSED: value}).paused is paused


# -- terminal_for_generation and settled ----------------------------------------------------


@pytest.mark.parametrize("reason", cond.REFUSED_FOR_GENERATION)
def test_a_refusal_holds_for_its_own_generation_only(reason):
    status = {"conditions": [synced("False", reason, 2)]}
    assert guardrails.terminal_for_generation(resource(status, generation=2))
    assert not guardrails.terminal_for_generation(resource(status, generation=3))


@pytest.mark.parametrize(
    "reason", [cond.RECONCILE_ERROR, cond.PAUSED, cond.PLAN_ONLY, cond.ACCOUNT_NOT_FOUND]
)
def test_other_refusals_are_not_for_good(reason):
    status = {"conditions": [synced("False", reason, 2)]}
    assert not guardrails.terminal_for_generation(resource(status))


def test_settled_needs_synced_true_and_the_generation_handled():
    done = {"observedGeneration": 2, "conditions": [synced("True", cond.RECONCILE_SUCCESS, 2)]}
    assert guardrails.settled(resource(done))
    assert not guardrails.settled(resource(done, generation=3))
    failed = {**done, "conditions": [synced("False", cond.RECONCILE_ERROR, 2)]}
    assert not guardrails.settled(resource(failed))


def test_at_rest_needs_ready_and_nothing_pending():
    status = {
        "observedGeneration": 2,
        "conditions": [
            {"type": cond.READY, "status": "True", "reason": cond.AVAILABLE},
            synced("True", cond.RECONCILE_SUCCESS, 2),
        ],
    }
    body: dict[str, Any] = {"metadata": {}}
    assert guardrails.at_rest(resource(status), body)
    assert not guardrails.at_rest(
        resource(status, annotations={annotation_keys.RECONCILE_REQUESTED_AT: "now"}), body
    )
    handled = {**status, "lastReconcileRequest": "now"}
    assert guardrails.at_rest(
        resource(handled, annotations={annotation_keys.RECONCILE_REQUESTED_AT: "now"}), body
    )
    assert not guardrails.at_rest(resource(status), {"metadata": {"deletionTimestamp": "t"}})


# -- namespace_terminating ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "terminating"),
    [
        ({"metadata": {"name": NS, "deletionTimestamp": "2030-01-01T00:00:00Z"}}, True),
        ({"metadata": {"name": NS}, "status": {"phase": "Terminating"}}, True),
        ({"metadata": {"name": NS}, "status": {"phase": "Active"}}, False),
        ({"metadata": {"name": NS}}, False),
        ({}, False),
    ],
)
def test_namespace_terminating(namespace, terminating):
    kube = FakeKube()
    kube.namespaces[NS] = namespace
    assert guardrails.namespace_terminating(kube, NS) is terminating
    assert kube.journal == [("kube", "get_namespace", NS)]


def test_a_namespace_not_found_is_not_terminating():
    assert guardrails.namespace_terminating(FakeKube(), "gone") is False


def test_a_namespace_that_may_not_be_read_is_not_terminating():
    kube = FakeKube()
    kube.namespaces[NS] = {"metadata": {"name": NS, "deletionTimestamp": "t"}}
    kube.script.fail("get_namespace", KubeError(403, "Forbidden", "namespaces is forbidden"))
    # A pause then keeps holding the deletion: the safe side.
    assert guardrails.namespace_terminating(kube, NS) is False


def test_other_failures_reading_the_namespace_are_not_swallowed():
    kube = FakeKube()
    kube.script.fail("get_namespace", RuntimeError("bug"))
    with pytest.raises(RuntimeError):
        guardrails.namespace_terminating(kube, NS)
