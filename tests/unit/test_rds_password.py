"""spec.masterPassword: the parameters, the switch's diff and handover, the grant's policy,
the rules on templates, and the connection Secret of a password Secrets Manager keeps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.access import iam
from provisioner.config import Settings
from provisioner.kinds import rds_password
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import FieldDiff, Observation
from provisioner.model import annotations as annotation_keys
from provisioner.model import connection_secret, v1beta1_rules
from provisioner.model.conversion import ConversionError, to_v1beta1
from provisioner.model.resource import Resource
from provisioner.reconciler.progress import Progress
from provisioner.reconciler.requested import EVERYTHING_REQUESTED
from provisioner.reconciler.secret import ConnectionSecret
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.fakes import FakeKube, FakePasswordCloud, Journal

NS, NAME = "team-a", "orders"
SECRET = f"{NAME}-connection"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-1-AbCdEf"
KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
MANAGED = {"managedBy": "SecretsManager"}


def resource(
    password: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    keys: dict[str, str] | None = None,
) -> Resource:
    spec: dict[str, Any] = {"engine": "postgres", "instanceClass": "db.t3.micro"}
    if password is not None:
        spec["masterPassword"] = password
    if keys is not None:
        spec["connectionSecret"] = {"keys": keys}
    body = {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "DatabaseInstance",
        "metadata": {
            "namespace": NS,
            "name": NAME,
            "uid": "uid-orders",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": spec,
    }
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def instance(kept: bool, key: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"DBInstanceStatus": "available"}
    if kept:
        found["MasterUserSecret"] = {
            "SecretArn": SECRET_ARN,
            "SecretStatus": "active",
            **({"KmsKeyId": key} if key else {}),
        }
    return found


# -- the spec and the cloud's parameters ------------------------------------------------------


def test_the_default_is_the_operator():
    spec = resource().spec.master_password
    assert spec == rds_password.PasswordSpec() and not spec.managed
    assert rds_password.create_params(spec, {"password": "p" * 32}) == {
        "MasterUserPassword": "p" * 32
    }


def test_secrets_manager_takes_no_password_from_the_operator():
    spec = resource({**MANAGED, "kmsKeyId": "alias/db"}).spec.master_password
    params = rds_password.create_params(spec, {"password": "p" * 32})
    assert params == {"ManageMasterUserPassword": True, "MasterUserSecretKmsKeyId": "alias/db"}


def test_the_keeper_is_a_diff_until_the_cloud_has_it():
    spec = resource(MANAGED).spec.master_password
    assert rds_password.diffs(spec, instance(False)) == [
        FieldDiff(rds_password.FIELD, "Operator", "SecretsManager")
    ]
    assert rds_password.diffs(spec, instance(True)) == []
    operator = resource().spec.master_password
    assert rds_password.diffs(operator, instance(True)) == [
        FieldDiff(rds_password.FIELD, "SecretsManager", "Operator")
    ]


def test_a_switch_back_carries_a_fresh_password_handed_over_once_taken():
    handover = rds_password.Handover()
    params: dict[str, Any] = {}
    switch = FieldDiff(rds_password.FIELD, "SecretsManager", "Operator")
    password = handover.prepare(resource().spec.master_password, switch, params)
    assert password is not None and len(password) == 32 and password.isalnum()
    assert params == {"ManageMasterUserPassword": False, "MasterUserPassword": password}
    handover.made("uid-orders", password, switch)
    assert handover.take("uid-orders") == password
    assert handover.take("uid-orders") is None


def test_a_switch_to_secrets_manager_hands_nothing_over():
    params: dict[str, Any] = {}
    switch = FieldDiff(rds_password.FIELD, "Operator", "SecretsManager")
    spec = resource(MANAGED).spec.master_password
    assert rds_password.Handover.prepare(spec, switch, params) is None
    assert params == {"ManageMasterUserPassword": True}
    assert rds_password.Handover.prepare(spec, None, params) is None


def test_status_and_connection_show_the_secret_only_when_kept():
    assert rds_password.connection(instance(True)) == {"passwordSecretArn": SECRET_ARN}
    assert rds_password.connection(instance(False)) == {}
    assert rds_password.status(instance(False)) == {"masterUserSecret": None}
    assert rds_password.status(instance(True, KEY_ARN)) == {
        "masterUserSecret": {"arn": SECRET_ARN, "status": "active", "kmsKeyId": KEY_ARN}
    }


# -- spec.access: the policy names the secret (and the named key) only ------------------------


def observed(kept: bool, key: str = "") -> Observation:
    status = rds_password.status(instance(kept, key))
    return Observation(exists=True, arn="arn:aws:rds:us-east-1:1:db:x", status=status)


def test_the_grant_is_on_the_secret_not_the_instance():
    db = kinds.descriptor("DatabaseInstance")
    arns = db.access_arns(resource(MANAGED), observed(True, KEY_ARN))
    assert arns == [SECRET_ARN]  # the default key of the account needs no grant
    (statement,) = iam.permission_policy(db, "read", arns)["Statement"]
    assert statement["Resource"] == [SECRET_ARN]
    assert statement["Action"] == [
        "secretsmanager:GetSecretValue",
        "secretsmanager:DescribeSecret",
    ]
    assert db.access_arns(resource(MANAGED), observed(False)) == []


def test_a_named_key_gets_its_own_statement():
    db = kinds.descriptor("DatabaseInstance")
    r = resource({**MANAGED, "kmsKeyId": "alias/db"})
    arns = db.access_arns(r, observed(True, KEY_ARN))
    assert arns == [SECRET_ARN, KEY_ARN]
    statements = iam.permission_policy(db, "read", arns)["Statement"]
    assert [(s["Action"], s["Resource"]) for s in statements] == [
        (["kms:Decrypt"], [KEY_ARN]),
        (["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"], [SECRET_ARN]),
    ]
    assert len({s["Sid"] for s in statements}) == 2


def test_the_named_key_decrypts_only_through_secrets_manager_for_that_secret():
    """The key is the spec's and may be another team's: the grant must not decrypt what else
    it encrypts."""
    db = kinds.descriptor("DatabaseInstance")
    r = resource({**MANAGED, "kmsKeyId": "alias/db"})
    statements = iam.permission_policy(db, "read", db.access_arns(r, observed(True, KEY_ARN)))
    key, secret = statements["Statement"]
    assert key["Condition"] == {
        "StringEquals": {
            "kms:ViaService": ["secretsmanager.us-east-1.amazonaws.com"],
            "kms:EncryptionContext:SecretARN": [SECRET_ARN],
        }
    }
    assert "Condition" not in secret


# -- templates and who keeps the password ----------------------------------------------------

URI = {"DATABASE_URL": "{{ .uri }}"}
HOST = {"PGHOST": "{{ .host }}"}
WHERE = {"PGHOST": "{{ .host }}", "SECRET": "{{ .passwordSecretArn }}"}


@pytest.mark.parametrize(
    ("templates", "kept", "message"),
    [
        ({}, False, ""),
        ({}, True, ""),
        (URI, False, ""),
        (HOST, False, v1beta1_rules.CREDENTIAL_MESSAGE),
        (WHERE, False, v1beta1_rules.CREDENTIAL_MESSAGE),
        (WHERE, True, ""),
        (HOST, True, ""),
        (URI, True, v1beta1_rules.KEPT_MESSAGE),
        ({**WHERE, "P": "x{{.password}}y"}, True, v1beta1_rules.KEPT_MESSAGE),
    ],
)
def test_templates_carry_the_password_exactly_when_the_operator_keeps_it(templates, kept, message):
    assert v1beta1_rules.keeper_template_problem("DatabaseInstance", templates, kept) == message
    assert v1beta1_rules.keeper_template_problem("Queue", templates, kept) == ""


def at_v1alpha1(keys: dict[str, str], password: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"engine": "postgres", "instanceClass": "db.t3.micro"}
    if password:
        spec["masterPassword"] = password
    return {
        "apiVersion": "cloud.provisioner.dev/v1alpha1",
        "kind": "DatabaseInstance",
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "annotations": {
                "cloud.provisioner.dev/v1beta1-fields": json.dumps(
                    {"connectionSecret": {"keys": keys}}
                )
            },
        },
        "spec": spec,
    }


def test_the_conversion_refuses_what_the_spec_rules_refuse():
    with pytest.raises(ConversionError, match="no template may name"):
        to_v1beta1(at_v1alpha1(URI, MANAGED), checked=True)
    with pytest.raises(ConversionError, match="at least one template must name"):
        to_v1beta1(at_v1alpha1(WHERE, None), checked=True)
    converted = to_v1beta1(at_v1alpha1(WHERE, MANAGED), checked=True)
    assert converted["spec"]["connectionSecret"]["keys"] == WHERE


# -- the connection Secret of a password the cloud keeps -------------------------------------


class FakeKeptCloud(FakePasswordCloud):
    """A database whose password the cloud may keep (`CloudKeptPasswordClient`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("DatabaseInstance", **kwargs)
        self.kept = False
        self.rotations = 0
        self.handed: str | None = None

    def observe(self, resource: Resource) -> Observation:
        obs = super().observe(resource)
        if self.kept:
            obs.connection[rds_password.SECRET_ARN] = SECRET_ARN
            obs.status.update(rds_password.status(instance(True)))
        return obs

    def cloud_keeps(self, resource: Resource, observation: Observation) -> bool:
        return rds_password.cloud_keeps(resource, observation)

    def handing_to_cloud(self, resource: Resource, observation: Observation) -> bool:
        return rds_password.handing_to_cloud(resource, observation)

    def handed_back(self, resource: Resource) -> str | None:
        handed, self.handed = self.handed, None
        return handed

    def rotate_kept(self, resource: Resource) -> None:
        self._record("rotate_kept", resource.external_name)
        self.rotations += 1


class World:
    def __init__(self) -> None:
        self.journal: Journal = []
        self.kube = FakeKube(self.journal)
        self.db = FakeKeptCloud(journal=self.journal)
        self.states = States()
        self.workers = Workers(Settings(workers=2, namespace_max_passes=0), {}, self.states)
        self.secret = ConnectionSecret(self.kube, self.workers, self.states)  # type: ignore[arg-type]

    def write(self, r: Resource, before_changes: bool = False) -> Progress:
        obs = self.db.observe(r)
        p = Progress(r, kinds.descriptor(r.kind), 0, EVERYTHING_REQUESTED)
        call = self.secret.before_changes if before_changes else self.secret.write
        asyncio.run(call(p, self.db, obs))
        return p

    def data(self) -> dict[str, str]:
        found = self.kube.secrets.get((NS, SECRET))
        assert found is not None
        return connection_secret.decode(found)


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.workers.executor.shutdown(wait=True)
        made.workers.look_executor.shutdown(wait=True)


def test_a_kept_password_is_never_in_the_secret(world):
    r = resource(MANAGED)
    world.db.seed(r)
    world.db.kept = True
    world.write(r)
    data = world.data()
    assert data[rds_password.SECRET_ARN] == SECRET_ARN
    assert "password" not in data and "uri" not in data
    assert world.db.writes() == [] and world.db.passwords == []
    stored = world.kube.secrets[(NS, SECRET)]
    assert connection_secret.PASSWORD_AT_ANNOTATION not in stored["metadata"]["annotations"]


def test_before_handing_the_password_over_the_secret_drops_it(world):
    operator = resource()
    world.db.seed(operator)
    world.write(operator)
    assert world.data()["password"]
    # Not handing over: nothing written before the changes.
    world.write(operator, before_changes=True)
    assert world.kube.secret_writes == [("create", SECRET)]
    world.write(resource(MANAGED), before_changes=True)
    data = world.data()
    assert "password" not in data and "uri" not in data
    assert rds_password.SECRET_ARN not in data  # not made yet
    assert world.db.writes() == ["set_password"]  # the first write's, none since


def test_a_password_handed_back_is_written_without_another_cloud_call(world):
    r = resource()
    world.db.seed(r)
    world.db.kept = True
    world.write(resource(MANAGED))
    world.db.kept = False
    world.db.handed = "Handed0Back0Password000000000000"
    world.db.objects[r.external_name].password = world.db.handed
    world.write(r)
    data = world.data()
    assert data["password"] == "Handed0Back0Password000000000000"
    assert rds_password.SECRET_ARN not in data
    assert "set_password" not in world.db.writes()


def test_a_lost_handover_sets_a_new_password_first(world):
    r = resource()
    world.db.seed(r)
    world.db.kept = True
    world.write(resource(MANAGED))
    world.db.kept = False  # switched back; the process that did it is gone
    p = world.write(r)
    assert world.db.writes() == ["set_password"]
    assert world.data()["password"] == world.db.objects[r.external_name].password
    assert [e.reason for e in p.events] == ["PasswordChanged", "SecretWritten"]


def test_the_rotation_annotation_asks_the_cloud(world):
    at = {annotation_keys.ROTATE_PASSWORD_AT: "2026-01-01T00:00:00Z"}
    r = resource(MANAGED, annotations=at)
    world.db.seed(r)
    world.db.kept = True
    p = world.write(r)
    assert world.db.rotations == 1 and world.db.writes() == ["rotate_kept"]
    assert p.fields["lastPasswordRotation"] == "2026-01-01T00:00:00Z"
    assert "password" not in world.data()
    # Not while the secret is still being made.
    world.db.kept = False
    world.write(resource(MANAGED, annotations=at))
    assert world.db.rotations == 1
