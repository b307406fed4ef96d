"""DatabaseInstance in a VPC, encrypted, protected: network, encryption, deletion protection,
windows and engine versions, through the API server against moto. The VPC, subnets, security
groups and KMS keys are made with boto3 in each test."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import yaml

from provisioner_dev.awsenv import aws_env
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.binaries import REPO_ROOT, cached_helm, ensure_helm
from tests.conftest import TEST_CLOUD
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    merge_patch,
    owned_cloud_resources,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600 if cached_helm() else 1500)]

GROUP = "cloud.provisioner.dev"
CHART = REPO_ROOT / "deploy" / "helm" / "provisioner"


class Vpc:
    """A VPC with two subnets (two zones), two security groups and a KMS key, in moto."""

    def __init__(self, endpoint_url: str, make: bool = True) -> None:
        env = aws_env(endpoint_url)
        session = boto3.session.Session(
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        )
        region = env["AWS_REGION"]
        self.ec2 = session.client("ec2", endpoint_url=endpoint_url)
        self.rds = session.client("rds", endpoint_url=endpoint_url)
        self.kms = session.client("kms", endpoint_url=endpoint_url)
        if make:
            self._make(region)

    @classmethod
    def through(cls, endpoint_url: str) -> Vpc:
        """The clients alone, e.g. through the aws-like proxy (nothing is made)."""
        return cls(endpoint_url, make=False)

    def _make(self, region: str) -> None:
        self.vpc = self.ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
        self.subnets = [
            self.ec2.create_subnet(
                VpcId=self.vpc, CidrBlock=f"10.20.{i}.0/24", AvailabilityZone=f"{region}{zone}"
            )["Subnet"]["SubnetId"]
            for i, zone in enumerate("ab")
        ]
        tag = uuid.uuid4().hex[:8]
        self.groups = [
            self.ec2.create_security_group(
                GroupName=f"db-{tag}-{i}", Description="database", VpcId=self.vpc
            )["GroupId"]
            for i in range(2)
        ]
        self.key = self.kms.create_key(Description="database")["KeyMetadata"]["Arn"]

    def instance(self, identifier: str) -> dict[str, Any] | None:
        try:
            return self.rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]
        except self.rds.exceptions.DBInstanceNotFoundFault:
            return None

    def subnet_group(self, name: str) -> dict[str, Any] | None:
        try:
            return self.rds.describe_db_subnet_groups(DBSubnetGroupName=name)["DBSubnetGroups"][0]
        except self.rds.exceptions.DBSubnetGroupNotFoundFault:
            return None

    def tags(self, arn: str) -> dict[str, str]:
        found = self.rds.list_tags_for_resource(ResourceName=arn)["TagList"]
        return {t["Key"]: t["Value"] for t in found}


@pytest.fixture
def vpc(aws) -> Vpc:
    return Vpc(aws.rds.meta.endpoint_url)


def manifest(name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> str:
    body = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "DatabaseInstance",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {
            "engine": "postgres",
            "instanceClass": "db.t3.micro",
            "deletionPolicy": "Delete",
            **spec,
        },
    }
    return yaml.safe_dump(body)


def security_groups(instance: dict[str, Any]) -> list[str]:
    return sorted(g["VpcSecurityGroupId"] for g in instance["VpcSecurityGroups"])


def request_reconcile(kube, namespace: str, name: str) -> dict[str, Any]:
    value = str(time.time())
    kube.kubectl(
        "annotate", "dbi", name, "-n", namespace, "--overwrite",
        f"{GROUP}/reconcile-requested-at={value}",
    )  # fmt: skip
    return wait_for(
        lambda: (
            (cr := get(kube, "dbi", namespace, name))
            and (cr.get("status") or {}).get("lastReconcileRequest") == value
            and cr
        ),
        timeout=90,
        what=f"a pass of {name} after the reconcile request",
    )


def test_a_database_in_our_subnets_encrypted_with_our_key(kube, operator, vpc, namespace):
    first, second = vpc.groups
    spec = {
        "network": {"subnetIds": vpc.subnets, "securityGroupIds": [first]},
        "encryption": {"kmsKeyId": vpc.key},
        "maintenanceWindow": "sun:03:00-sun:04:00",
        "backupWindow": "01:00-01:30",
        "autoMinorVersionUpgrade": False,
    }
    apply(kube, namespace, manifest("orders", spec))
    cr = wait_ready(kube, "dbi", namespace, "orders", timeout=90)
    identifier = cr["status"]["externalName"]
    group_name = f"provisioner-{identifier}"
    assert cr["status"]["subnetGroup"] == group_name
    assert cr["status"]["storageEncrypted"] is True and cr["status"]["kmsKeyId"] == vpc.key

    group = vpc.subnet_group(group_name)
    assert group is not None
    assert {s["SubnetIdentifier"] for s in group["Subnets"]} == set(vpc.subnets)
    tags = vpc.tags(group["DBSubnetGroupArn"])
    assert tags["provisioner.dev/owner-uid"] == cr["metadata"]["uid"]
    assert tags["provisioner.dev/namespace"] == namespace
    instance = vpc.instance(identifier)
    assert instance["DBSubnetGroup"]["DBSubnetGroupName"] == group_name
    assert security_groups(instance) == [first]
    assert instance["StorageEncrypted"] is True and instance["KmsKeyId"] == vpc.key
    assert instance["PreferredMaintenanceWindow"] == "sun:03:00-sun:04:00"
    assert instance["PreferredBackupWindow"] == "01:00-01:30"
    assert instance["AutoMinorVersionUpgrade"] is False
    assert instance["DeletionProtection"] is False

    # Security groups and windows are mutable.
    merge_patch(
        kube, "dbi", namespace, "orders",
        f'{{"spec":{{"network":{{"securityGroupIds":["{first}","{second}"]}},'
        '"backupWindow":"02:00-02:30"}}',
    )  # fmt: skip
    wait_ready(kube, "dbi", namespace, "orders", generation=2)
    instance = vpc.instance(identifier)
    assert security_groups(instance) == sorted([first, second])
    assert instance["PreferredBackupWindow"] == "02:00-02:30"

    # Drift behind the operator's back is corrected and named.
    vpc.rds.modify_db_instance(
        DBInstanceIdentifier=identifier,
        VpcSecurityGroupIds=[second],
        PreferredMaintenanceWindow="mon:05:00-mon:06:00",
        ApplyImmediately=True,
    )
    request_reconcile(kube, namespace, "orders")
    instance = vpc.instance(identifier)
    assert security_groups(instance) == sorted([first, second])
    assert instance["PreferredMaintenanceWindow"] == "sun:03:00-sun:04:00"
    drifted = " ".join(e["message"] for e in events(kube, namespace, "orders", "Drifted"))
    assert "spec.network.securityGroupIds" in drifted and "spec.maintenanceWindow" in drifted

    # The finalizer holds until the instance and then its subnet group are gone.
    kube.kubectl("delete", "dbi", "orders", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "orders", timeout=90)
    assert vpc.instance(identifier) is None
    assert vpc.subnet_group(group_name) is None


@pytest.mark.parametrize(
    ("network", "said"),
    [
        ({"subnetIds": ["subnet-0123456789abcdef0"]}, "subnet subnet-0123456789abcdef0 not found"),
        ({"securityGroupIds": ["sg-0123456789abcdef0"]}, "security group sg-0123456789abcdef0"),
        ({"subnetGroupName": "no-such-group"}, "DB subnet group no-such-group not found"),
    ],
)
def test_what_does_not_exist_is_named_before_anything_is_made(
    kube, operator, aws, vpc, namespace, network, said
):
    if "subnetIds" in network:
        network = {"subnetIds": [vpc.subnets[0], *network["subnetIds"]]}
    apply(kube, namespace, manifest("nowhere", {"network": network}))
    cr = wait_condition(kube, "dbi", namespace, "nowhere", "Synced", "False", "InvalidSpec")
    message = condition(cr, "Synced")["message"]
    assert said in message and "spec.network." in message
    assert owned_cloud_resources(aws, cr["metadata"]["uid"]) == []
    # Nothing was made: the resource goes at once.
    kube.kubectl("delete", "dbi", "nowhere", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "nowhere")


def test_an_existing_subnet_group_is_used_and_kept(kube, operator, vpc, namespace):
    name = f"shared-{uuid.uuid4().hex[:8]}"
    vpc.rds.create_db_subnet_group(
        DBSubnetGroupName=name, DBSubnetGroupDescription="shared", SubnetIds=vpc.subnets
    )
    apply(kube, namespace, manifest("shared", {"network": {"subnetGroupName": name}}))
    cr = wait_ready(kube, "dbi", namespace, "shared", timeout=90)
    identifier = cr["status"]["externalName"]
    assert vpc.instance(identifier)["DBSubnetGroup"]["DBSubnetGroupName"] == name
    assert not cr["status"].get("subnetGroup")
    kube.kubectl("delete", "dbi", "shared", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "shared", timeout=90)
    assert vpc.instance(identifier) is None
    assert vpc.subnet_group(name) is not None


def test_deletion_protection_holds_the_finalizer_until_it_is_off(kube, operator, vpc, namespace):
    apply(kube, namespace, manifest("kept", {"deletionProtection": True}))
    cr = wait_ready(kube, "dbi", namespace, "kept", timeout=90)
    identifier = cr["status"]["externalName"]
    assert vpc.instance(identifier)["DeletionProtection"] is True

    # No admission policy here: the finalizer holds, says why and how to go on.
    kube.kubectl("delete", "dbi", "kept", "-n", namespace, "--wait=false")
    cr = wait_condition(kube, "dbi", namespace, "kept", "Synced", "False", "DeletionProtected")
    message = condition(cr, "Synced")["message"]
    assert "spec.deletionProtection" in message and 'deletionProtection":false' in message
    warned = wait_for(
        lambda: events(kube, namespace, "kept", "DeletionProtected"),
        what="the DeletionProtected Event",
    )
    assert warned[0]["type"] == "Warning"
    assert vpc.instance(identifier) is not None

    # Turned off: the operator turns RDS's flag off too, then deletes by deletionPolicy.
    merge_patch(kube, "dbi", namespace, "kept", '{"spec":{"deletionProtection":false}}')
    wait_gone(kube, "dbi", namespace, "kept", timeout=90)
    assert vpc.instance(identifier) is None


def test_deletion_protection_drift_is_corrected_or_reported(kube, operator, vpc, namespace):
    report = {f"{GROUP}/drift-policy": "report"}
    apply(kube, namespace, manifest("watched", {"deletionProtection": True}, report))
    cr = wait_ready(kube, "dbi", namespace, "watched", timeout=90)
    identifier = cr["status"]["externalName"]
    vpc.rds.modify_db_instance(
        DBInstanceIdentifier=identifier, DeletionProtection=False, ApplyImmediately=True
    )
    cr = request_reconcile(kube, namespace, "watched")
    drifted = condition(cr, "Drifted")
    assert drifted["status"] == "True" and "spec.deletionProtection" in drifted["message"]
    assert vpc.instance(identifier)["DeletionProtection"] is False  # reported, not corrected

    kube.kubectl("annotate", "dbi", "watched", "-n", namespace, f"{GROUP}/drift-policy-")
    wait_for(
        lambda: vpc.instance(identifier)["DeletionProtection"],
        timeout=90,
        what="the drift to be corrected without drift-policy report",
    )
    merge_patch(kube, "dbi", namespace, "watched", '{"spec":{"deletionProtection":false}}')
    wait_ready(kube, "dbi", namespace, "watched", generation=2)
    kube.kubectl("delete", "dbi", "watched", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "watched", timeout=90)


def test_plan_only_lists_the_new_fields(kube, operator, vpc, namespace):
    apply(kube, namespace, manifest("planned", {}))
    wait_ready(kube, "dbi", namespace, "planned", timeout=90)
    kube.kubectl("annotate", "dbi", "planned", "-n", namespace, f"{GROUP}/plan-only=true")
    merge_patch(
        kube, "dbi", namespace, "planned",
        '{"spec":{"deletionProtection":true,"maintenanceWindow":"sat:01:00-sat:02:00",'
        f'"autoMinorVersionUpgrade":false,"network":{{"securityGroupIds":["{vpc.groups[0]}"]}}}}}}',
    )  # fmt: skip
    cr = wait_for(
        lambda: (
            (c := get(kube, "dbi", namespace, "planned"))
            and ((c["status"].get("plan") or {}).get("generation") == 2)
            and c
        ),
        timeout=60,
        what="the plan of generation 2",
    )
    fields = {c["field"] for c in cr["status"]["plan"]["changes"]}
    assert {
        "spec.deletionProtection",
        "spec.maintenanceWindow",
        "spec.autoMinorVersionUpgrade",
        "spec.network.securityGroupIds",
    } <= fields
    instance = vpc.instance(cr["status"]["externalName"])
    assert instance["DeletionProtection"] is False  # planned, not applied
    # The spec asks for protection (planned or not): the deletion waits until it is off.
    merge_patch(kube, "dbi", namespace, "planned", '{"spec":{"deletionProtection":false}}')
    kube.kubectl("delete", "dbi", "planned", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "planned", timeout=90)


def test_engine_versions_go_up_minor_in_place_major_when_allowed(kube, operator, vpc, namespace):
    apply(kube, namespace, manifest("versioned", {"engineVersion": "16.3"}))
    cr = wait_ready(kube, "dbi", namespace, "versioned", timeout=90)
    identifier = cr["status"]["externalName"]
    merge_patch(kube, "dbi", namespace, "versioned", '{"spec":{"engineVersion":"16.4"}}')
    wait_ready(kube, "dbi", namespace, "versioned", generation=2)
    assert vpc.instance(identifier)["EngineVersion"] == "16.4"

    merge_patch(kube, "dbi", namespace, "versioned", '{"spec":{"engineVersion":"17.2"}}')
    cr = wait_condition(kube, "dbi", namespace, "versioned", "Synced", "False", "InvalidSpec")
    assert "spec.allowMajorVersionUpgrade: true" in condition(cr, "Synced")["message"]
    assert vpc.instance(identifier)["EngineVersion"] == "16.4"
    merge_patch(kube, "dbi", namespace, "versioned", '{"spec":{"allowMajorVersionUpgrade":true}}')
    wait_ready(kube, "dbi", namespace, "versioned", generation=4)
    assert vpc.instance(identifier)["EngineVersion"] == "17.2"

    merge_patch(kube, "dbi", namespace, "versioned", '{"spec":{"engineVersion":"16.4"}}')
    cr = wait_condition(kube, "dbi", namespace, "versioned", "Synced", "False", "InvalidSpec")
    assert "older than the instance's 17.2" in condition(cr, "Synced")["message"]
    assert vpc.instance(identifier)["EngineVersion"] == "17.2"
    kube.kubectl("delete", "dbi", "versioned", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "versioned", timeout=90)


def test_an_adopted_unencrypted_instance_keeps_running_and_says_so(kube, operator, vpc, namespace):
    identifier = f"plain-{uuid.uuid4().hex[:8]}"
    vpc.rds.create_db_instance(
        DBInstanceIdentifier=identifier,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="x" * 24,
        StorageEncrypted=False,
        Tags=[{"Key": "provisioner.dev/adoptable-by", "Value": namespace}],
    )
    apply(
        kube,
        namespace,
        manifest(
            "plain",
            {"instanceIdentifier": identifier, "deletionPolicy": "Retain"},
            {f"{GROUP}/adopt": "true"},
        ),
    )
    cr = wait_ready(kube, "dbi", namespace, "plain", timeout=90)
    assert cr["spec"]["encryption"]["enabled"] is True
    assert cr["status"]["storageEncrypted"] is False and not cr["status"].get("kmsKeyId")
    assert vpc.instance(identifier)["StorageEncrypted"] is False
    assert not events(kube, namespace, "plain", "Drifted")
    kube.kubectl("delete", "dbi", "plain", "-n", namespace, "--wait=false")
    wait_gone(kube, "dbi", namespace, "plain")
    assert vpc.instance(identifier) is not None
    vpc.rds.delete_db_instance(DBInstanceIdentifier=identifier, SkipFinalSnapshot=True)


def test_bad_combinations_are_refused_at_apply(kube, own_namespace):
    namespace = own_namespace  # no operator acts there: the API server alone refuses
    for spec, said in [
        (
            {"network": {"subnetGroupName": "g", "subnetIds": ["subnet-0a"]}},
            "spec.network.subnetGroupName and spec.network.subnetIds are exclusive",
        ),
        (
            {"encryption": {"enabled": False, "kmsKeyId": "alias/db"}},
            "spec.encryption.kmsKeyId needs spec.encryption.enabled: true",
        ),
        ({"maintenanceWindow": "sunday 3am"}, "spec.maintenanceWindow must be ddd:hh24:mi"),
        ({"backupWindow": "1:00-1:30"}, "spec.backupWindow must be hh24:mi-hh24:mi"),
    ]:
        assert_refused(try_apply(kube, namespace, manifest("refused", spec)), said)

    apply(kube, namespace, manifest("fixed", {"network": {"subnetIds": ["subnet-0a"]}}))
    for patch, said in [
        ('{"spec":{"encryption":{"enabled":false}}}', "spec.encryption.enabled is immutable"),
        (
            '{"spec":{"encryption":{"kmsKeyId":"alias/db"}}}',
            "spec.encryption.kmsKeyId is immutable",
        ),
        (
            '{"spec":{"network":{"subnetIds":["subnet-0b"]}}}',
            "spec.network.subnetIds is immutable",
        ),
        (
            '{"spec":{"network":{"subnetIds":null,"subnetGroupName":"g"}}}',
            "spec.network.subnetGroupName is immutable",
        ),
    ]:
        refused = kube.kubectl(
            "patch", "dbi", "fixed", "-n", namespace, "--type=merge", "-p", patch, check=False
        )
        assert_refused(refused, said)
    # Security groups are mutable.
    kube.kubectl(
        "patch", "dbi", "fixed", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"network":{"securityGroupIds":["sg-0a"]}}}',
    )  # fmt: skip


def render(release: str, template: str, *sets: str) -> list[dict]:
    args = [str(ensure_helm()), "template", release, str(CHART)]
    args += ["--namespace", "deletion-ops", "--show-only", f"templates/{template}"]
    for value in sets:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture
def protected_namespace(kube, own_namespace: str) -> Iterator[str]:
    """An own-* namespace (no operator acts there) where the chart's deletion-protection
    policy applies, and only there."""
    tag = f"a{uuid.uuid4().hex[:8]}"  # never a number to `helm --set`
    docs = render(
        tag,
        "deletion-protection.yaml",
        f"deletionProtection.namespaceSelector.matchLabels.deletion-test={tag}",
    )
    assert sorted(d["kind"] for d in docs) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    kube.kubectl("label", "namespace", own_namespace, f"deletion-test={tag}")
    try:
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        yield own_namespace
    finally:
        for doc in docs:
            kube.kubectl(
                "delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False
            )


def test_the_chart_policy_refuses_deleting_a_protected_database(kube, protected_namespace):
    ns = protected_namespace
    apply(kube, ns, manifest("guarded", {"deletionProtection": True}))

    def refused() -> Any:
        done = kube.kubectl("delete", "dbi", "guarded", "-n", ns, "--wait=false", check=False)
        return done if done.returncode != 0 else None

    # The API server loads a new policy within a few seconds; until then the delete would
    # pass: probe with a dry run first.
    wait_for(
        lambda: (
            kube.kubectl(
                "delete", "dbi", "guarded", "-n", ns, "--dry-run=server", check=False
            ).returncode
            != 0
        ),
        timeout=60,
        what="the deletion-protection policy to be enforced",
    )
    done = refused()
    assert done is not None
    assert "has spec.deletionProtection: true" in done.stderr
    assert '{"spec":{"deletionProtection":false}}' in done.stderr
    assert get(kube, "dbi", ns, "guarded") is not None

    merge_patch(kube, "dbi", ns, "guarded", '{"spec":{"deletionProtection":false}}')
    kube.kubectl("delete", "dbi", "guarded", "-n", ns, "--wait=false")
    wait_gone(kube, "dbi", ns, "guarded")


# -- crash safety: the subnet group made, the instance not yet ------------------------------


def wait_killed(op, timeout: float = 90) -> None:
    wait_for(lambda: op.proc.poll() is not None, timeout=timeout, what="the operator to be killed")
    assert op.proc.returncode == -9, f"operator exited with {op.proc.returncode}, not SIGKILL"
    op.proc = None


def killed_after_the_subnet_group(kube, vpc, namespace, start_operator, name) -> dict[str, Any]:
    """Apply a database in subnets to an operator killed right after it made the subnet
    group; the group exists and is recorded in status, the instance does not."""
    doomed = start_operator(env={"PROVISIONER_CRASHPOINTS": "after-subnet-group"})
    apply(kube, namespace, manifest(name, {"network": {"subnetIds": vpc.subnets}}))
    wait_killed(doomed)
    cr = get(kube, "dbi", namespace, name)
    assert cr is not None
    uid = cr["metadata"]["uid"]
    group = cr["status"]["subnetGroup"]
    assert vpc.subnet_group(group) is not None
    identifier = group.removeprefix("provisioner-")
    assert vpc.instance(identifier) is None
    return {"uid": uid, "group": group, "identifier": identifier}


def test_killed_after_the_subnet_group_goes_on_with_it(
    kube, aws, vpc, own_namespace, start_operator
):
    made = killed_after_the_subnet_group(kube, vpc, own_namespace, start_operator, "resumed")
    start_operator()
    cr = wait_ready(kube, "dbi", own_namespace, "resumed", timeout=90)
    assert cr["status"]["externalName"] == made["identifier"]
    owned = sorted(owned_cloud_resources(aws, made["uid"]))
    assert owned == [("DBSubnetGroup", made["group"]), ("DatabaseInstance", made["identifier"])]
    assert vpc.instance(made["identifier"])["DBSubnetGroup"]["DBSubnetGroupName"] == made["group"]
    kube.kubectl("delete", "dbi", "resumed", "-n", own_namespace, "--wait=false")
    wait_gone(kube, "dbi", own_namespace, "resumed", timeout=90)
    assert owned_cloud_resources(aws, made["uid"]) == []


def test_killed_after_the_subnet_group_then_deleted_leaves_nothing(
    kube, aws, vpc, own_namespace, start_operator
):
    made = killed_after_the_subnet_group(kube, vpc, own_namespace, start_operator, "dropped")
    kube.kubectl("delete", "dbi", "dropped", "-n", own_namespace, "--wait=false")
    start_operator()
    wait_gone(kube, "dbi", own_namespace, "dropped", timeout=90)
    assert owned_cloud_resources(aws, made["uid"]) == []
    assert vpc.subnet_group(made["group"]) is None


# -- the aws-like profile: modifying, deleting, and the subnet group after the instance -------


@pytest.fixture
def aws_like(cluster) -> Iterator[Any]:
    """An aws-like proxy in front of the session's moto, RDS at 60x: the modification and
    the deletion last 10 s each."""
    if TEST_CLOUD != "moto":
        pytest.skip("the aws-like proxy stands in front of moto")
    proxy = AwsLikeProxy(
        upstream=cluster.moto.url,
        args=[
            "--time-scale=60",
            "--duration=rds.create=120",
            "--duration=rds.backup=60",
            "--duration=rds.modify=600",
            "--duration=rds.delete=600",
        ],
        seed=11,
        log=cluster.dir / f"awslike-{uuid.uuid4().hex[:6]}.log",
    )
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_protected_database_in_subnets_under_the_aws_like_profile(
    kube, vpc, aws_like, own_namespace, start_operator
):
    start_operator(endpoint_url=aws_like.url)
    seen = Vpc.through(aws_like.url)
    first, second = vpc.groups
    spec = {
        "network": {"subnetIds": vpc.subnets, "securityGroupIds": [first]},
        "deletionProtection": True,
    }
    apply(kube, own_namespace, manifest("slow", spec))
    cr = wait_ready(kube, "dbi", own_namespace, "slow", timeout=90)
    identifier, group = cr["status"]["externalName"], cr["status"]["subnetGroup"]

    merge_patch(
        kube, "dbi", own_namespace, "slow",
        f'{{"spec":{{"network":{{"securityGroupIds":["{first}","{second}"]}}}}}}',
    )  # fmt: skip
    wait_for(
        lambda: (seen.instance(identifier) or {}).get("DBInstanceStatus") == "modifying",
        timeout=30,
        what="the security group change to show the instance modifying",
    )
    wait_ready(kube, "dbi", own_namespace, "slow", timeout=90, generation=2)
    assert security_groups(seen.instance(identifier)) == sorted([first, second])

    kube.kubectl("delete", "dbi", "slow", "-n", own_namespace, "--wait=false")
    wait_condition(kube, "dbi", own_namespace, "slow", "Synced", "False", "DeletionProtected")
    merge_patch(kube, "dbi", own_namespace, "slow", '{"spec":{"deletionProtection":false}}')
    # RDS's flag off (modifying), then deleting: the finalizer and the subnet group stay
    # until the cloud says the instance is gone.
    wait_for(
        lambda: (seen.instance(identifier) or {}).get("DBInstanceStatus") == "deleting",
        timeout=60,
        what="the instance to be deleting",
    )
    held = get(kube, "dbi", own_namespace, "slow")
    assert held is not None and vpc.subnet_group(group) is not None
    wait_gone(kube, "dbi", own_namespace, "slow", timeout=120)
    assert seen.instance(identifier) is None and vpc.subnet_group(group) is None
