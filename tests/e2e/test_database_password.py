"""spec.masterPassword: Secrets Manager keeps a DatabaseInstance's master password.

Through the real API server against moto: the connection Secret carries passwordSecretArn and
never the password; GetSecretValue reads the password RDS made; switching either way is a
requested change that plan-only shows; a SIGKILL in the middle of a switch leaves no Secret
claiming a password the cloud does not take; the rotation annotation asks RDS; spec.access
grants reading that secret only.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pytest

from provisioner.access import iam as iam_names
from provisioner_dev.cloud import DevCloud
from tests.conftest import on_moto_only
from tests.e2e.test_access import (  # noqa: F401 - fixtures: moto with IAM enforcement on
    ACCOUNT,
    access_namespace,
    cloud,
    policies,
    role_exists,
    role_name,
    sa_annotation,
)
from tests.e2e.test_awslike import RDS_SCALE, aws_like  # noqa: F401 - its fixture
from tests.e2e.test_crash_safety import wait_killed
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    merge_patch,
    secret_data,
    try_apply,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, on_moto_only]

GROUP = "cloud.provisioner.dev"
KEPT_KEYS = {"host", "port", "username", "database", "engine", "arn", "passwordSecretArn"}
OPERATOR_KEYS = {"host", "port", "username", "password", "database", "engine", "uri", "arn"}


def db(name: str, extra: str = "", annotations: str = "") -> str:
    return (
        "apiVersion: cloud.provisioner.dev/v1beta1\nkind: DatabaseInstance\n"
        f"metadata:\n  name: {name}\n{annotations}"
        "spec:\n  engine: postgres\n  instanceClass: db.t3.micro\n  deletionPolicy: Delete\n"
        f"{extra}"
    )


KEPT = "  masterPassword: {managedBy: SecretsManager}\n"


# A MasterUserPassword parameter (not ManageMasterUserPassword's or RotateMasterUserPassword's).
PASSWORD_PARAM = re.compile(r"(?:^|[&\s])MasterUserPassword=([A-Za-z0-9]+)")


def passwords_sent(kube, identifier: str) -> list[str]:
    """The MasterUserPassword of every call moto received for `identifier`, in order."""
    return [m.group(1) for r in kube.cloud_requests(identifier) for m in PASSWORD_PARAM.finditer(r)]


def last_password_sent(kube, identifier: str) -> str | None:
    sent = passwords_sent(kube, identifier)
    return sent[-1] if sent else None


@functools.cache
def _cloud(endpoint_url: str) -> DevCloud:
    return DevCloud(endpoint_url)


def client(aws, service: str) -> Any:
    """A boto3 client of `service` on the test's cloud (Secrets Manager, KMS)."""
    return _cloud(aws.rds.meta.endpoint_url).client(service)


def instance(aws, identifier: str) -> dict:
    return aws.rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]


def secret_value(aws, arn: str) -> dict:
    return json.loads(client(aws, "secretsmanager").get_secret_value(SecretId=arn)["SecretString"])


def wait_secret(kube, ns: str, name: str, keys: set[str], timeout: float = 90) -> dict[str, str]:
    def probe() -> dict[str, str] | None:
        data = secret_data(kube, ns, f"{name}-connection")
        return data if data is not None and set(data) == keys else None

    return wait_for(probe, timeout=timeout, what=f"the Secret of {name} with keys {sorted(keys)}")


def delete(kube, ns: str, name: str) -> None:
    kube.kubectl("delete", "dbi", name, "-n", ns, "--wait=false")
    wait_gone(kube, "dbi", ns, name, timeout=90)


def test_secrets_manager_keeps_the_password_and_rotates_it(kube, operator, aws, namespace):
    ns = namespace
    apply(kube, ns, db("vault", KEPT))
    cr = wait_ready(kube, "dbi", ns, "vault")
    identifier = cr["status"]["externalName"]
    described = instance(aws, identifier)
    arn = described["MasterUserSecret"]["SecretArn"]

    data = wait_secret(kube, ns, "vault", KEPT_KEYS)
    assert data["passwordSecretArn"] == arn == cr["status"]["masterUserSecret"]["arn"]
    assert cr["status"]["masterUserSecret"]["kmsKeyId"]
    # The password is RDS's, in Secrets Manager: never in the Secret, never sent by us.
    password = secret_value(aws, arn)["password"]
    assert password and password not in json.dumps(data)
    assert passwords_sent(kube, identifier) == []

    # The rotation annotation asks RDS, which rotates its secret.
    sm = client(aws, "secretsmanager")
    versions = len(sm.list_secret_version_ids(SecretId=arn)["Versions"])
    kube.kubectl(
        "annotate", "dbi", "vault", "-n", ns, f"{GROUP}/rotate-password-at=2026-02-01T00:00:00Z"
    )
    wait_for(
        lambda: (
            get(kube, "dbi", ns, "vault")["status"].get("lastPasswordRotation")
            == "2026-02-01T00:00:00Z"
        ),
        timeout=60,
        what="the rotation recorded",
    )
    assert len(sm.list_secret_version_ids(SecretId=arn)["Versions"]) == versions + 1
    assert any("RotateMasterUserPassword=true" in r for r in kube.cloud_requests(identifier))
    assert "password" not in secret_data(kube, ns, "vault-connection")
    changed = [e["message"] for e in events(kube, ns, "vault", "PasswordChanged")]
    assert changed == ["master password rotation asked of the cloud"]

    delete(kube, ns, "vault")
    listed = {s["ARN"] for s in sm.list_secrets()["SecretList"]}
    assert arn not in listed  # RDS deletes its secret with the instance


def test_switching_is_planned_then_applied_both_ways(kube, operator, aws, namespace):
    ns = namespace
    apply(kube, ns, db("switch"))
    cr = wait_ready(kube, "dbi", ns, "switch")
    identifier = cr["status"]["externalName"]
    first = wait_secret(kube, ns, "switch", OPERATOR_KEYS)["password"]

    # Planned: the plan names the change, nothing is written.
    kube.kubectl("annotate", "dbi", "switch", "-n", ns, f"{GROUP}/plan-only=true")
    merge_patch(
        kube, "dbi", ns, "switch", '{"spec":{"masterPassword":{"managedBy":"SecretsManager"}}}'
    )
    planned = wait_for(
        lambda: (
            (o := get(kube, "dbi", ns, "switch"))
            and (o["status"].get("plan") or {}).get("generation") == 2
            and o
        ),
        what="the plan of the switch",
    )
    assert planned["status"]["plan"]["changes"] == [
        {"field": "spec.masterPassword.managedBy", "cloud": "Operator", "spec": "SecretsManager"}
    ]
    assert "MasterUserSecret" not in instance(aws, identifier)
    assert secret_data(kube, ns, "switch-connection")["password"] == first

    # Applied: RDS keeps a password of its own; the Secret says where, not what.
    kube.kubectl("annotate", "dbi", "switch", "-n", ns, f"{GROUP}/plan-only-")
    cr = wait_ready(kube, "dbi", ns, "switch", generation=2)
    data = wait_secret(kube, ns, "switch", KEPT_KEYS)
    arn = instance(aws, identifier)["MasterUserSecret"]["SecretArn"]
    assert data["passwordSecretArn"] == arn == cr["status"]["masterUserSecret"]["arn"]
    assert secret_value(aws, arn)["password"] != first
    updated = [e["message"] for e in events(kube, ns, "switch", "Updated")]
    assert "updated spec.masterPassword.managedBy" in updated

    # And back: a fresh password of the operator's, the one the cloud took last.
    merge_patch(kube, "dbi", ns, "switch", '{"spec":{"masterPassword":{"managedBy":"Operator"}}}')
    wait_ready(kube, "dbi", ns, "switch", generation=3)
    data = wait_secret(kube, ns, "switch", OPERATOR_KEYS)
    assert data["password"] != first and data["password"] == last_password_sent(kube, identifier)
    assert "MasterUserSecret" not in instance(aws, identifier)
    assert "masterUserSecret" not in get(kube, "dbi", ns, "switch")["status"]
    assert data["password"] not in operator.log.read_text(errors="replace")
    delete(kube, ns, "switch")


@pytest.mark.parametrize("target", ["SecretsManager", "Operator"])
def test_killed_in_the_middle_of_a_switch_never_leaves_a_stale_password(
    kube, aws, own_namespace, start_operator, target
):
    ns = own_namespace
    start = "Operator" if target == "SecretsManager" else "SecretsManager"
    first = start_operator()
    apply(kube, ns, db("midway", f"  masterPassword: {{managedBy: {start}}}\n"))
    cr = wait_ready(kube, "dbi", ns, "midway")
    identifier = cr["status"]["externalName"]
    wait_secret(kube, ns, "midway", OPERATOR_KEYS if start == "Operator" else KEPT_KEYS)
    first.stop()

    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-password-switch"})
    patch = json.dumps({"spec": {"masterPassword": {"managedBy": target}}})
    merge_patch(kube, "dbi", ns, "midway", patch)
    wait_killed(doomed)
    kept_now = "MasterUserSecret" in instance(aws, identifier)
    assert kept_now == (target == "SecretsManager")  # the switch was made
    # Killed before the Secret was written: it claims no password the cloud no longer takes.
    data = secret_data(kube, ns, "midway-connection")
    if target == "SecretsManager":
        assert "password" not in data and "uri" not in data
    else:
        assert "password" not in data  # the password the dead process set is lost with it

    start_operator()
    wait_ready(kube, "dbi", ns, "midway", generation=2)
    if target == "SecretsManager":
        data = wait_secret(kube, ns, "midway", KEPT_KEYS)
        arn = instance(aws, identifier)["MasterUserSecret"]["SecretArn"]
        assert data["passwordSecretArn"] == arn
    else:
        data = wait_secret(kube, ns, "midway", OPERATOR_KEYS)
        # A new password, set in the cloud again before it was written.
        assert data["password"] == last_password_sent(kube, identifier)
        assert "MasterUserSecret" not in instance(aws, identifier)
    delete(kube, ns, "midway")


def test_bad_combinations_are_refused_at_apply_time(kube, namespace):
    ns = namespace
    refusals = [
        (
            "  masterPassword: {kmsKeyId: alias/db}\n",
            "spec.masterPassword.kmsKeyId needs spec.masterPassword.managedBy SecretsManager",
        ),
        (
            "  access: [{serviceAccountName: app}]\n",
            "spec.access needs spec.masterPassword.managedBy SecretsManager",
        ),
        (
            KEPT + "  connectionSecret: {keys: {DATABASE_URL: '{{ .uri }}'}}\n",
            "with spec.masterPassword.managedBy SecretsManager no template may name",
        ),
        (
            "  connectionSecret: {keys: {SECRET: '{{ .passwordSecretArn }}'}}\n",
            "at least one template must name {{ .password }} or {{ .uri }}",
        ),
        (
            KEPT + "  access: [{serviceAccountName: app, level: write}]\n",
            'Unsupported value: "write"',
        ),
    ]
    for extra, message in refusals:
        assert_refused(try_apply(kube, ns, db("refused", extra)), message)
    assert get(kube, "dbi", ns, "refused") is None


def test_the_key_is_fixed_while_secrets_manager_keeps_the_password(kube, operator, aws, namespace):
    ns = namespace
    key = client(aws, "kms").create_key(Description="orders db secret")["KeyMetadata"]
    apply(
        kube,
        ns,
        db("keyed", f"  masterPassword: {{managedBy: SecretsManager, kmsKeyId: {key['KeyId']}}}\n"),
    )
    cr = wait_ready(kube, "dbi", ns, "keyed")
    assert cr["status"]["masterUserSecret"]["kmsKeyId"] == key["Arn"]
    other = client(aws, "kms").create_key(Description="another")["KeyMetadata"]
    changed = f"  masterPassword: {{managedBy: SecretsManager, kmsKeyId: {other['KeyId']}}}\n"
    assert_refused(
        try_apply(kube, ns, db("keyed", changed)),
        "spec.masterPassword.kmsKeyId cannot change while Secrets Manager keeps the password",
    )
    delete(kube, ns, "keyed")


def test_templates_say_where_the_password_is(kube, operator, aws, namespace):
    ns = namespace
    keys = (
        "  connectionSecret:\n    keys:\n      PGHOST: '{{ .host }}'\n"
        "      PGPASSWORD_SECRET: 'aws-secret:{{ .passwordSecretArn }}'\n"
    )
    apply(kube, ns, db("templated", KEPT + keys))
    cr = wait_ready(kube, "dbi", ns, "templated")
    data = wait_secret(kube, ns, "templated", {"PGHOST", "PGPASSWORD_SECRET"})
    arn = cr["status"]["masterUserSecret"]["arn"]
    assert data["PGPASSWORD_SECRET"] == f"aws-secret:{arn}"
    assert condition(cr, "Synced")["status"] == "True"
    delete(kube, ns, "templated")


# -- spec.access: reading the master user secret, through an operator with --access=irsa --------


def test_access_grants_reading_that_secret_only(kube, cloud, access_namespace):  # noqa: F811
    """The grant's policy, read back from IAM, names that database's secret (and the key the
    spec names) and nothing else. moto authorises Secrets Manager calls against `*`, not the
    secret's ARN, so the pod's own GetSecretValue is not evaluated here: the documents are."""
    ns = access_namespace
    kube.kubectl("create", "serviceaccount", "reader", "-n", ns)
    kms = cloud.client("kms")
    key = kms.create_key(Description="orders db secret")["KeyMetadata"]
    grant = "  access: [{serviceAccountName: reader}]\n"
    keyed = f"  masterPassword: {{managedBy: SecretsManager, kmsKeyId: {key['KeyId']}}}\n"
    apply(kube, ns, db("granted", KEPT + grant) + "---\n" + db("keyed", keyed + grant))
    apply(kube, ns, db("other", KEPT))
    crs = {n: wait_ready(kube, "dbi", ns, n, timeout=120) for n in ("granted", "keyed", "other")}
    role = role_name(ns, "reader")
    arn = f"arn:aws:iam::{ACCOUNT}:role/provisioner/{role}"
    for name in ("granted", "keyed"):
        assert crs[name]["status"]["access"] == [
            {"serviceAccountName": "reader", "level": "read", "roleArn": arn}
        ]
    assert sa_annotation(kube, ns, "reader") == arn
    secrets = {n: crs[n]["status"]["masterUserSecret"]["arn"] for n in crs}
    assert len(set(secrets.values())) == 3

    docs = policies(cloud, role)
    names = {
        n: iam_names.policy_name("DatabaseInstance", n, crs[n]["metadata"]["uid"]) for n in crs
    }
    assert set(docs) == {names["granted"], names["keyed"]}
    reading = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    (only,) = docs[names["granted"]]["Statement"]
    assert (only["Action"], only["Resource"]) == (reading, [secrets["granted"]])
    keyed_statements = {
        tuple(s["Action"]): s["Resource"] for s in docs[names["keyed"]]["Statement"]
    }
    assert keyed_statements == {
        ("kms:Decrypt",): [key["Arn"]],
        tuple(reading): [secrets["keyed"]],
    }
    everything = json.dumps(docs)
    assert secrets["other"] not in everything and crs["granted"]["status"]["arn"] not in everything
    # The operator's own credentials read the password RDS keeps there.
    value = cloud.client("secretsmanager").get_secret_value(SecretId=secrets["granted"])
    assert json.loads(value["SecretString"])["password"]

    # Back to the operator: the grant goes with the secret (the CEL rule asks both at once).
    refused = try_apply(kube, ns, db("granted", grant))
    assert_refused(refused, "spec.access needs spec.masterPassword.managedBy SecretsManager")
    merge_patch(
        kube,
        "dbi",
        ns,
        "granted",
        '{"spec":{"access":null,"masterPassword":{"managedBy":"Operator"}}}',
    )
    wait_ready(kube, "dbi", ns, "granted", generation=2)
    wait_for(lambda: set(policies(cloud, role)) == {names["keyed"]}, what="the grant revoked")
    data = wait_secret(kube, ns, "granted", OPERATOR_KEYS)
    assert data["password"]
    assert not get(kube, "dbi", ns, "granted")["status"].get("access")

    for name in crs:
        delete(kube, ns, name)
    assert not role_exists(cloud, role)
    assert sa_annotation(kube, ns, "reader") is None


# -- the aws-like profile: the rotation and the switch take RDS's time -----------------------


def test_rotation_and_switch_under_the_aws_like_profile(
    kube,
    aws_like,  # noqa: F811 - the fixture imported above
    own_namespace,
    start_operator,
):
    ns = own_namespace
    # 4 min creating, 1 min backing up, 2 min resetting, 10 min modifying: at 60, seconds.
    slow = aws_like(
        RDS_SCALE, rds_create=240, rds_backup=60, rds_reset_password=120, rds_modify=600
    )
    start_operator(endpoint_url=slow.proxy.url)
    apply(kube, ns, db("slow", KEPT))
    cr = wait_ready(kube, "dbi", ns, "slow", timeout=90)
    identifier = cr["status"]["externalName"]
    arn = wait_secret(kube, ns, "slow", KEPT_KEYS)["passwordSecretArn"]
    assert arn == slow.db(identifier)["MasterUserSecret"]["SecretArn"]

    kube.kubectl("annotate", "dbi", "slow", "-n", ns, f"{GROUP}/rotate-password-at=first")
    wait_for(
        lambda: get(kube, "dbi", ns, "slow")["status"].get("lastPasswordRotation") == "first",
        timeout=60,
        what="the rotation recorded",
    )
    # Switched back while RDS still resets the credentials: sent once it is available.
    merge_patch(kube, "dbi", ns, "slow", '{"spec":{"masterPassword":{"managedBy":"Operator"}}}')
    cr = wait_ready(kube, "dbi", ns, "slow", generation=2, timeout=120)
    data = wait_secret(kube, ns, "slow", OPERATOR_KEYS)
    assert data["password"] == last_password_sent(kube, identifier)
    assert "MasterUserSecret" not in slow.db(identifier)
    stats = slow.stats()
    refused = {k: v for k, v in stats["refusals_by_action"].items() if "Modify" in k}
    # The rotation and the switch, each sent once, none refused as busy.
    assert stats["calls_by_action"].get("rds.ModifyDBInstance") == 2 and refused == {}, stats
    delete(kube, ns, "slow")


# -- drift and adoption -------------------------------------------------------------------------


def reconcile_now(kube, ns: str, name: str, value: str) -> None:
    kube.kubectl(
        "annotate", "dbi", name, "-n", ns, "--overwrite", f"{GROUP}/reconcile-requested-at={value}"
    )


def test_a_switch_behind_the_operators_back_is_drift(kube, operator, aws, namespace):
    ns = namespace
    apply(kube, ns, db("drifting", KEPT))
    cr = wait_ready(kube, "dbi", ns, "drifting")
    identifier = cr["status"]["externalName"]
    first = wait_secret(kube, ns, "drifting", KEPT_KEYS)["passwordSecretArn"]

    # Taken back by hand: corrected, with a new secret of RDS's, named in the Secret.
    aws.rds.modify_db_instance(
        DBInstanceIdentifier=identifier,
        ManageMasterUserPassword=False,
        MasterUserPassword="ByHand0Password0000000000000000",
        ApplyImmediately=True,
    )
    reconcile_now(kube, ns, "drifting", "one")
    wait_for(
        lambda: (
            (i := instance(aws, identifier)).get("MasterUserSecret")
            and i["MasterUserSecret"]["SecretArn"] != first
        ),
        timeout=60,
        what="the drift corrected",
    )
    second = instance(aws, identifier)["MasterUserSecret"]["SecretArn"]
    data = wait_for(
        lambda: (
            (d := secret_data(kube, ns, "drifting-connection"))
            and d.get("passwordSecretArn") == second
            and d
        ),
        timeout=60,
        what="the Secret to name the new secret",
    )
    assert "password" not in data
    drifted = [e["message"] for e in events(kube, ns, "drifting", "Drifted")]
    assert any("spec.masterPassword.managedBy" in m for m in drifted), drifted

    # Under drift-policy report: reported, not corrected; the Secret still carries no password.
    kube.kubectl("annotate", "dbi", "drifting", "-n", ns, f"{GROUP}/drift-policy=report")
    aws.rds.modify_db_instance(
        DBInstanceIdentifier=identifier,
        ManageMasterUserPassword=False,
        MasterUserPassword="ByHand0Password0000000000000001",
        ApplyImmediately=True,
    )
    reconcile_now(kube, ns, "drifting", "two")
    cr = wait_for(
        lambda: (
            (o := get(kube, "dbi", ns, "drifting"))
            and (condition(o, "Drifted") or {}).get("reason") == "DriftReported"
            and o
        ),
        timeout=60,
        what="the drift reported",
    )
    assert "spec.masterPassword.managedBy" in condition(cr, "Drifted")["message"]
    assert "MasterUserSecret" not in instance(aws, identifier)
    data = secret_data(kube, ns, "drifting-connection")
    assert "password" not in data and "ByHand0Password0000000000000001" not in json.dumps(data)
    delete(kube, ns, "drifting")


def test_adopting_an_instance_whose_password_secrets_manager_keeps(kube, operator, aws, namespace):
    ns = namespace
    identifier = f"adopt-{namespace}"[:60].rstrip("-")
    aws.rds.create_db_instance(
        DBInstanceIdentifier=identifier,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        ManageMasterUserPassword=True,
        BackupRetentionPeriod=7,
        Tags=[{"Key": "provisioner.dev/adoptable-by", "Value": ns}],
    )
    arn = instance(aws, identifier)["MasterUserSecret"]["SecretArn"]
    adopt = f"  annotations: {{{GROUP}/adopt: 'true'}}\n"
    apply(kube, ns, db("adopted", KEPT + f"  instanceIdentifier: {identifier}\n", adopt))
    cr = wait_ready(kube, "dbi", ns, "adopted")
    assert cr["status"]["masterUserSecret"]["arn"] == arn
    data = wait_secret(kube, ns, "adopted", KEPT_KEYS)
    assert data["passwordSecretArn"] == arn  # read, not switched: the same secret
    assert instance(aws, identifier)["MasterUserSecret"]["SecretArn"] == arn
    assert not [e for e in events(kube, ns, "adopted", "Drifted")]
    assert passwords_sent(kube, identifier) == []
    delete(kube, ns, "adopted")
