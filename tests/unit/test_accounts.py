"""Where a resource lives (provisioner/placement/accounts.py) and the assumed-role session cache
(provisioner/aws/assume.py), without a cluster or a cloud."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.aws.assume import AssumedSessions
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.account import AccountRef
from provisioner.placement.accounts import AccountRefused, Directory, selector_matches

TEAM_A = {
    "metadata": {"name": "team-a", "generation": 1},
    "spec": {
        "accountId": "111111111111",
        "roleArn": "arn:aws:iam::111111111111:role/provisioner",
        "regions": ["eu-west-1", "us-east-1"],
        "defaultRegion": "eu-west-1",
        "namespaceSelector": {"matchLabels": {"team": "a"}},
    },
}


def directory(namespaces: dict[str, dict[str, Any]], accounts: list[dict[str, Any]]) -> Directory:
    by_name = {a["metadata"]["name"]: a for a in accounts}
    return Directory(by_name.get, lambda n: {"metadata": {"name": n, **namespaces[n]}})


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({}, {"team": "a"}, False),  # empty selects none
        ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
        (
            {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
            {"team": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "prod", "operator": "DoesNotExist"}]}, {"prod": ""}, False),
    ],
)
def test_label_selector(selector, labels, selected):
    assert selector_matches(selector, labels) is selected


def test_spec_account_in_a_selected_namespace_uses_its_default_region():
    d = directory({"ns-a": {"labels": {"team": "a"}}}, [TEAM_A])
    placed = d.place("ns-a", "team-a", "", {}, "us-west-2")
    assert placed.account is not None and placed.account.account_id == "111111111111"
    assert placed.region == "eu-west-1"


def test_namespace_default_account_applies_when_the_spec_names_none():
    annotations = {annotation_keys.DEFAULT_ACCOUNT: "team-a"}
    d = directory({"ns-a": {"labels": {"team": "a"}, "annotations": annotations}}, [TEAM_A])
    placed = d.place("ns-a", "", "us-east-1", {}, "us-west-2")
    assert placed.account is not None and placed.account.name == "team-a"
    assert placed.region == "us-east-1"


def test_no_account_anywhere_is_the_operators_own():
    d = directory({"ns": {}}, [TEAM_A])
    placed = d.place("ns", "", "", {}, "us-west-2")
    assert placed.account is None and placed.region == "us-west-2"


@pytest.mark.parametrize(
    ("namespace", "account", "region", "reason"),
    [
        ("ns-b", "team-a", "", cond.ACCOUNT_NOT_ALLOWED),
        ("ns-a", "nobody", "", cond.ACCOUNT_NOT_FOUND),
        ("ns-a", "team-a", "ap-south-1", cond.REGION_NOT_ALLOWED),
    ],
)
def test_refusals(namespace, account, region, reason):
    d = directory({"ns-a": {"labels": {"team": "a"}}, "ns-b": {"labels": {"team": "b"}}}, [TEAM_A])
    with pytest.raises(AccountRefused) as refused:
        d.place(namespace, account, region, {}, "us-east-1")
    assert refused.value.reason == reason


def test_a_placed_resource_never_moves():
    """status.account pins it: a namespace default added later changes nothing, and a spec
    naming another account is refused rather than creating a second resource."""
    annotations = {annotation_keys.DEFAULT_ACCOUNT: "team-a"}
    d = directory({"ns-a": {"labels": {"team": "a"}, "annotations": annotations}}, [TEAM_A])
    own = {"account": "", "region": "us-west-2", "externalName": "x"}
    assert d.place("ns-a", "", "", own, "us-east-1").account is None
    assert d.place("ns-a", "", "", own, "us-east-1").region == "us-west-2"
    with pytest.raises(AccountRefused) as refused:
        d.place("ns-a", "team-a", "", own, "us-east-1")
    assert refused.value.reason == cond.INVALID_SPEC
    legacy = {"externalName": "created-before-cloudaccounts"}
    assert d.place("ns-a", "", "", legacy, "us-east-1").account is None


def test_a_resource_that_lives_in_an_account_may_clean_up_after_its_namespace_lost_it():
    d = directory({"ns-b": {"labels": {"team": "b"}}}, [TEAM_A])
    status = {"account": "team-a", "region": "ap-south-1"}
    with pytest.raises(AccountRefused):
        d.place("ns-b", "team-a", "", status, "us-east-1")
    placed = d.place("ns-b", "team-a", "", status, "us-east-1", deleting=True)
    assert placed.account is not None and placed.region == "ap-south-1"


def test_an_unknown_name_is_asked_of_the_api_server_once_per_few_seconds():
    asked: list[str] = []
    now = [0.0]

    def load(name: str) -> None:
        asked.append(name)

    d = Directory(load, lambda n: None, clock=lambda: now[0])
    assert d.account("nobody") is None and d.account("nobody") is None
    assert asked == ["nobody"]
    now[0] = 10.0
    d.account("nobody")
    assert asked == ["nobody", "nobody"]


# -- the session cache ---------------------------------------------------------------------


class FakeSts:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = False
        self.lock = threading.Lock()

    def assume_role(self, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append(kwargs)
        if self.fail:
            raise errors.TerminalError("not authorized to perform: sts:AssumeRole", "AccessDenied")
        expires = datetime.datetime.fromtimestamp(
            CLOCK[0] + kwargs["DurationSeconds"], datetime.UTC
        )
        n = len(self.calls)
        return {
            "Credentials": {
                "AccessKeyId": f"ASIA{n}",
                "SecretAccessKey": "s",
                "SessionToken": "t",
                "Expiration": expires,
            },
            "AssumedRoleUser": {"Arn": f"{kwargs['RoleArn']}/{kwargs['RoleSessionName']}"},
        }


CLOCK = [1_000_000.0]
ACCOUNT = AccountRef("team-a", "111111111111", "arn:aws:iam::111111111111:role/p", "ext-1")


def sessions(sts: FakeSts) -> AssumedSessions:
    return AssumedSessions(
        lambda: sts,
        "provisioner-test",
        lambda fn, **kw: fn(**kw),
        clock=lambda: CLOCK[0],
    )


def test_one_assume_role_per_session_lifetime_refreshed_ahead_of_expiry():
    sts = FakeSts()
    cache = sessions(sts)
    first = cache.session(ACCOUNT)
    for _ in range(100):
        assert cache.session(ACCOUNT) is first
    assert len(sts.calls) == 1
    assert sts.calls[0]["ExternalId"] == "ext-1"
    assert first.assumed_arn.endswith("/provisioner-test")
    CLOCK[0] += 3600 - 900 - 1  # just outside the refresh window: still the same session
    assert cache.session(ACCOUNT) is first
    CLOCK[0] += 2  # inside it: a new one, before the old one expires
    assert cache.session(ACCOUNT) is not first
    assert len(sts.calls) == 2


def test_a_failure_is_remembered_briefly_and_an_edit_tries_at_once():
    sts = FakeSts()
    sts.fail = True
    cache = sessions(sts)
    outcomes: list[str] = []
    cache.listeners.append(lambda name, outcome: outcomes.append(outcome))
    for _ in range(5):
        with pytest.raises(errors.AccountUnavailableError) as failed:
            cache.session(ACCOUNT)
    assert "AccessDenied" in str(failed.value)
    assert len(sts.calls) == 1
    sts.fail = False
    fixed = AccountRef(ACCOUNT.name, ACCOUNT.account_id, ACCOUNT.role_arn + "2")
    assert cache.session(fixed).access_key  # another role: no wait
    cache.forget(ACCOUNT.name)
    assert cache.session(ACCOUNT).access_key  # forgotten: no wait either
    assert outcomes.count("error") == 1 and outcomes.count("ok") == 2


def test_concurrent_first_uses_make_one_call():
    sts = FakeSts()
    cache = sessions(sts)
    threads = [threading.Thread(target=cache.session, args=(ACCOUNT,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sts.calls) == 1


# -- the reconciler with a directory -------------------------------------------------------


def reconcile_queue(spec: dict[str, Any], labels: dict[str, str]) -> tuple[Any, Any, Any, Any]:
    """One reconcile pass of a new Queue in namespace `ns` with `labels`."""
    import asyncio

    from provisioner import API_VERSION
    from provisioner.config import Settings
    from provisioner.reconciler.engine import Reconciler
    from tests.unit.fakes import FakeCloud, FakeKube

    cloud, kube = FakeCloud("Queue"), FakeKube()
    body = {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"namespace": "ns", "name": "q", "uid": "uid-q", "generation": 1},
        "spec": spec,
    }
    kube.resources[("Queue", "ns", "q")] = body
    reconciler = Reconciler(
        Settings(region="us-east-1", cluster_id="test", workers=2),
        kube,  # type: ignore[arg-type]
        {"Queue": cloud},
        lambda *_: None,
        directory=directory({"ns": {"labels": labels}}, [TEAM_A]),
        own_account=lambda: "123456789012",
    )
    try:
        result, resource = asyncio.run(reconciler.reconcile(body, 0, None))
    finally:
        reconciler.executor.shutdown(wait=True)
    return result, resource, cloud, kube


def test_a_refused_account_costs_no_cloud_call():
    result, _, cloud, kube = reconcile_queue({"account": "team-a"}, {"team": "b"})
    synced = next(c for c in result.conditions if c.type == cond.SYNCED)
    assert (synced.status, synced.reason) == (False, cond.ACCOUNT_NOT_ALLOWED)
    assert cloud.calls == [] and kube.status_patches == []
    assert result.requeue_after is not None


def test_the_account_is_recorded_before_the_create_call_and_reaches_the_client():
    result, resource, cloud, kube = reconcile_queue({"account": "team-a"}, {"team": "a"})
    assert resource.account is not None and resource.account.role_arn.endswith(":role/provisioner")
    assert resource.region == "eu-west-1"
    assert kube.status_patches[0][2] == {
        "account": "team-a",
        "accountId": "111111111111",
        "region": "eu-west-1",
    }
    assert [c.method for c in cloud.calls][:2] == ["observe", "create"]
    assert result.fields["accountId"] == "111111111111"


def test_a_resumed_resource_is_scheduled_where_its_status_says_it_lives():
    """Calm restart: a resource at rest is not placed (no API call) but its resync schedule
    (and the batched describe) must use its recorded account and region."""
    from provisioner import API_VERSION
    from provisioner.config import Settings
    from provisioner.kinds import registry as kinds
    from provisioner.reconciler.engine import Reconciler

    d = directory({}, [TEAM_A])
    d.account_seen(TEAM_A)
    reconciler = Reconciler(
        Settings(region="us-east-1", cluster_id="test", workers=1),
        None,
        {},
        lambda *_: None,
        directory=d,
    )
    body = {
        "apiVersion": API_VERSION,
        "kind": "DatabaseInstance",
        "metadata": {"namespace": "ns", "name": "db", "uid": "u", "generation": 1},
        "spec": {"engine": "postgres", "instanceClass": "db.t3.micro"},
        "status": {"account": "team-a", "region": "eu-west-1", "externalName": "x"},
    }
    placed = reconciler.known_placement(kinds.parse(body, region="us-east-1", cluster_id="t"))
    assert placed.account is not None and placed.account.account_id == "111111111111"
    assert placed.region == "eu-west-1"
    body["status"] = {"externalName": "x"}  # from before CloudAccounts: as it is
    as_is = reconciler.known_placement(kinds.parse(body, region="us-east-1", cluster_id="t"))
    assert as_is.account is None and as_is.region == "us-east-1"
    reconciler.executor.shutdown()
