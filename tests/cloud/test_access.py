"""spec.access in process against moto's IAM: EKS Pod Identity (whose association API moto
does not offer: the three association calls are kept in a dict here, everything else is
moto's IAM), and the leak finder's IAM roles."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from provisioner.access import iam
from provisioner.access.grants import Access
from provisioner.access.iam import AccessSettings, Association, IamClient
from provisioner.model import conditions as cond
from provisioner.model.account import AccountRef
from provisioner.tools import leaks
from provisioner_dev.serviceaccounts import MemoryServiceAccounts
from tests.cloud.conftest import build_resource, full_client
from tests.unit.fakes import FakeKube

CLUSTER = "test-cluster"
POD_IDENTITY = AccessSettings("pod-identity", eks_cluster="prod")


class Associations(IamClient):
    """moto's IAM; EKS pod identity associations in a dict, as EKS's API keeps them."""

    def __init__(self, aws: Any) -> None:
        super().__init__(aws)
        self.made: dict[tuple[str, str, str], Association] = {}

    def association(self, cluster: str, namespace: str, sa: str) -> Association | None:
        return self.made.get((cluster, namespace, sa))

    def create_association(self, cluster, namespace, sa, role, tags) -> None:
        key = (cluster, namespace, sa)
        self.made.setdefault(key, Association(f"a-{len(self.made)}", role))

    def delete_association(self, cluster: str, association_id: str) -> None:
        self.made = {k: v for k, v in self.made.items() if v.id != association_id}


async def _run(fn, *args):
    return fn(*args)


def access(aws, settings: AccessSettings = POD_IDENTITY) -> tuple[Access, Associations, FakeKube]:
    kube = FakeKube()
    granter = Access(settings, CLUSTER, aws, kube, _run)  # type: ignore[arg-type]
    client = Associations(aws)
    granter.iam = client
    return granter, client, kube


def granting(namespace: str, *grants: tuple[str, str]):
    resource = build_resource("Queue", namespace=namespace)
    return dataclasses.replace(resource, access=tuple(grants), status={})


def test_pod_identity_grant_then_revoke(aws):
    granter, client, kube = access(aws)
    queue = granting("pi-a", ("worker", "write"))
    arn = "arn:aws:sqs:us-east-1:123456789012:pi-a-queue"
    outcome = asyncio.run(granter.converge(queue, [arn]))
    assert outcome is not None and outcome.problem is None
    role = iam.role_name(CLUSTER, "pi-a", "worker")
    (entry,) = outcome.entries
    assert entry == {
        "serviceAccountName": "worker",
        "level": "write",
        "roleArn": f"arn:aws:iam::123456789012:role/provisioner/{role}",
    }
    # Recorded in status before the role was made.
    assert kube.status_patches[0][2] == {"access": [entry]}
    assert client.made[("prod", "pi-a", "worker")].role_arn == entry["roleArn"]
    made = aws.client("iam").get_role(RoleName=role)["Role"]
    trust = made["AssumeRolePolicyDocument"]["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (policy,) = aws.client("iam").list_role_policies(RoleName=role)["PolicyNames"]
    document = aws.client("iam").get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    assert document["Statement"][0]["Resource"] == [arn]
    # Again: nothing to write.
    queue = dataclasses.replace(queue, status={"access": outcome.entries})
    again = asyncio.run(granter.converge(queue, [arn]))
    assert again is not None and again.events == []

    gone = dataclasses.replace(queue, access=())
    asyncio.run(granter.converge(gone, [arn]))
    assert client.made == {}
    listed = aws.client("iam").list_roles(PathPrefix=iam.ROLE_PATH)["Roles"]
    assert role not in [r["RoleName"] for r in listed]


def test_pod_identity_association_with_another_role_is_left_alone(aws):
    granter, client, _ = access(aws)
    client.made[("prod", "pi-b", "web")] = Association("theirs", "arn:aws:iam::1:role/theirs")
    outcome = asyncio.run(granter.converge(granting("pi-b", ("web", "read")), ["arn:aws:sqs:::q"]))
    assert outcome is not None and outcome.problem is not None
    assert outcome.problem.reason == cond.ACCESS_CONFLICT
    assert "arn:aws:iam::1:role/theirs" in outcome.problem.message
    assert outcome.entries == []
    with pytest.raises(Exception, match="NoSuchEntity"):
        aws.client("iam").get_role(RoleName=iam.role_name(CLUSTER, "pi-b", "web"))
    assert client.made[("prod", "pi-b", "web")].id == "theirs"


def test_pod_identity_refuses_a_resource_in_another_account(aws):
    granter, _, _ = access(aws)
    elsewhere = dataclasses.replace(
        granting("pi-c", ("web", "read")),
        account=AccountRef("team-b", "222222222222", "arn:aws:iam::222222222222:role/p", ""),
    )
    outcome = asyncio.run(granter.converge(elsewhere, ["arn:aws:sqs:::q"]))
    assert outcome is not None and outcome.problem is not None
    assert outcome.problem.reason == cond.ACCESS_NOT_SUPPORTED


def test_leaks_lists_a_role_nobody_grants_and_a_policy_whose_resource_is_gone(aws):
    client = aws.client("iam")
    tags = iam.role_tags(CLUSTER, "leaky", "old")
    for sa in ("old", "kept"):
        client.create_role(
            RoleName=iam.role_name(CLUSTER, "leaky", sa),
            Path=iam.ROLE_PATH,
            AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
            Tags=[{"Key": k, "Value": v} for k, v in {**tags, iam.SERVICE_ACCOUNT_TAG: sa}.items()],
        )
    kept = iam.role_name(CLUSTER, "leaky", "kept")
    document = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sqs:GetQueueUrl", "Resource": "*"}],
        }
    )
    client.put_role_policy(
        RoleName=kept, PolicyName="Queue.gone.0123456789", PolicyDocument=document
    )
    live = {"kind": "Queue", "metadata": {"namespace": "leaky", "name": "live", "uid": "u-live"}}
    live["spec"] = {"access": [{"serviceAccountName": "kept"}]}
    client.put_role_policy(
        RoleName=kept,
        PolicyName=iam.policy_name("Queue", "live", "u-live"),
        PolicyDocument=document,
    )
    # Two CloudAccounts in one AWS account: IAM is global, each role is listed once.
    place = ("", aws, ["us-east-1"])
    found = leaks._leaked_roles([place, place], [live], CLUSTER)
    mine = [f for f in found if "leaky" in f.name]
    assert sorted((f.kind, f.name) for f in mine) == [
        ("IAMRole", iam.role_name(CLUSTER, "leaky", "old")),
        ("IAMRolePolicy", f"{kept}/Queue.gone.0123456789"),
    ]


class ServiceAccounts(MemoryServiceAccounts, FakeKube):
    """FakeKube with ServiceAccounts, as IRSA grants read and annotate them."""

    def __init__(self) -> None:
        MemoryServiceAccounts.__init__(self)
        FakeKube.__init__(self)


def test_an_irsa_grant_lives_in_the_cloud_account_of_its_resource(aws):
    """The role, its trust and its OIDC provider are in the resource's account, not the
    operator's own (moto acts in the account of the role assumed)."""
    team_b = AccountRef("team-b", "222222222222", "arn:aws:iam::222222222222:role/provisioner")
    issuer = "https://oidc.eks.eu-west-1.amazonaws.com/id/TEAMB"
    kube = ServiceAccounts()
    meta = kube.add_service_account("acc-b", "web")
    granter = Access(AccessSettings("irsa", oidc_issuer=issuer), CLUSTER, aws, kube, _run)
    queue = dataclasses.replace(granting("acc-b", ("web", "read")), account=team_b)
    arn = "arn:aws:sqs:us-east-1:222222222222:acc-b-queue"
    role = iam.role_name(CLUSTER, "acc-b", "web")
    provider = "arn:aws:iam::222222222222:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/TEAMB"

    refused = asyncio.run(granter.converge(queue, [arn]))
    assert refused is not None and refused.problem is not None
    assert refused.problem.reason == cond.OIDC_PROVIDER_NOT_FOUND
    assert provider in refused.problem.message
    team_b_iam = aws.client("iam", None, team_b)
    with pytest.raises(Exception, match="NoSuchEntity"):
        team_b_iam.get_role(RoleName=role)

    full_client(team_b_iam).create_open_id_connect_provider(
        Url=issuer, ClientIDList=["sts.amazonaws.com"], ThumbprintList=["b" * 40]
    )
    outcome = asyncio.run(granter.converge(queue, [arn]))
    assert outcome is not None and outcome.problem is None
    (entry,) = outcome.entries
    assert entry["roleArn"] == f"arn:aws:iam::222222222222:role/provisioner/{role}"
    made = team_b_iam.get_role(RoleName=role)["Role"]
    assert made["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Federated": provider}
    with pytest.raises(Exception, match="NoSuchEntity"):
        aws.client("iam").get_role(RoleName=role)  # not in the operator's own account
    assert meta["annotations"][iam.ROLE_ANNOTATION] == entry["roleArn"]

    queue = dataclasses.replace(queue, status={"access": outcome.entries})
    assert asyncio.run(granter.revoke_all(queue)) == [
        ("Normal", "AccessRevoked", "ServiceAccount web: access revoked")
    ]
    with pytest.raises(Exception, match="NoSuchEntity"):
        team_b_iam.get_role(RoleName=role)
    assert iam.ROLE_ANNOTATION not in meta["annotations"]
