"""spec.access: an IAM role per ServiceAccount, one policy per granting resource, with IRSA.

The cloud is a moto server of this module's own with IAM enforcement on: the operator signs
as an IAM user allowed everything, the test's pods-to-be with credentials from
AssumeRoleWithWebIdentity on the generated role, so moto decides every call of theirs by the
role's policies. moto evaluates S3 and SQS calls against the resource's ARN; it does not check
SNS calls against a topic's ARN, so Topic grants are asserted on the policy documents only.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
import botocore.exceptions
import botocore.parsers
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from provisioner.access import iam as iam_names
from provisioner_dev.awsenv import DEV_REGION
from provisioner_dev.services import MotoServer
from tests.conftest import Cluster, fresh_namespace, on_moto_only
from tests.e2e.conftest import operators
from tests.e2e.test_crash_safety import wait_killed
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    get,
    manifests,
    merge_patch,
    try_apply,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = on_moto_only

ISSUER = "https://oidc.access-test.example/id/CLUSTER1"
ACCOUNT = "123456789012"
CLUSTER_ID = "test"  # what tests/e2e/conftest.py's operators are started with
READ_ONLY_S3 = {"s3:PutObject", "s3:DeleteObject"}


@dataclass
class EnforcingCloud:
    moto: MotoServer
    admin: boto3.session.Session
    keys: dict[str, str]

    def client(self, service: str):
        return self.admin.client(service, endpoint_url=self.moto.url)

    def web_identity(self, role_arn: str) -> boto3.session.Session:
        """A pod's session: AssumeRoleWithWebIdentity on the role, as the SDK does with the
        token IRSA mounts. moto answers that unsigned call only while its authentication is
        off, so it is let through alone (retried if another caller took the free request)."""
        sts = boto3.client(
            "sts",
            endpoint_url=self.moto.url,
            region_name=DEV_REGION,
            config=Config(signature_version=UNSIGNED),
        )

        def attempt():
            self._auth(1)
            try:
                return sts.assume_role_with_web_identity(
                    RoleArn=role_arn, RoleSessionName="pod-session", WebIdentityToken="token-of-pod"
                )["Credentials"]
            except (
                botocore.exceptions.ClientError,
                botocore.exceptions.BotoCoreError,
                # moto answers a 500 page when another caller's request meets the toggled
                # authentication halfway: the free request was not ours, try again.
                botocore.parsers.ResponseParserError,
            ):
                return None
            finally:
                self._auth(0)

        creds = wait_for(attempt, timeout=30, what="AssumeRoleWithWebIdentity")
        return boto3.session.Session(
            aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"],
            region_name=DEV_REGION,
        )

    def _auth(self, free_requests: int) -> None:
        url = f"{self.moto.url}/moto-api/reset-auth"
        request = urllib.request.Request(  # noqa: S310 - loopback only
            url,
            data=str(free_requests).encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # a form body would not reach moto
        )
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310 - loopback only
            pass


@pytest.fixture(scope="module")
def cloud(cluster: Cluster) -> Iterator[EnforcingCloud]:
    moto = MotoServer(log=cluster.dir / f"moto-access-{time.monotonic_ns()}.log")
    moto.start()
    try:
        root = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=DEV_REGION
        )
        iam = root.client("iam", endpoint_url=moto.url)
        iam.create_user(UserName="provisioner-operator")
        iam.put_user_policy(
            UserName="provisioner-operator",
            PolicyName="everything",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="provisioner-operator")["AccessKey"]
        iam.create_open_id_connect_provider(
            Url=ISSUER, ClientIDList=["sts.amazonaws.com"], ThumbprintList=["a" * 40]
        )
        keys = {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        admin = boto3.session.Session(
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
            region_name=DEV_REGION,
        )
        enforcing = EnforcingCloud(moto, admin, keys)
        enforcing._auth(0)  # from here on, every call is authenticated and authorised
        yield enforcing
    finally:
        moto.stop()


own_namespace = contextmanager(fresh_namespace)


def start_access_operator(start, cloud: EnforcingCloud, env: dict[str, str] | None = None):
    return start(
        endpoint_url=cloud.moto.url,
        env={**cloud.keys, **(env or {})},
        args=["--access=irsa", f"--oidc-issuer={ISSUER}", "--accounts=off"],
    )


@pytest.fixture(scope="module")
def access_namespace(cluster: Cluster, cloud: EnforcingCloud) -> Iterator[str]:
    """An own-* namespace served by one operator with --access=irsa against `cloud`."""
    with own_namespace(cluster, "own-access") as namespace, operators(cluster, namespace) as start:
        start_access_operator(start, cloud)
        yield namespace


def role_name(namespace: str, sa: str) -> str:
    return iam_names.role_name(CLUSTER_ID, namespace, sa)


def policies(cloud: EnforcingCloud, role: str) -> dict[str, dict]:
    iam = cloud.client("iam")
    try:
        names = iam.list_role_policies(RoleName=role)["PolicyNames"]
    except iam.exceptions.NoSuchEntityException:
        return {}
    return {n: iam.get_role_policy(RoleName=role, PolicyName=n)["PolicyDocument"] for n in names}


def role_exists(cloud: EnforcingCloud, role: str) -> bool:
    iam = cloud.client("iam")
    try:
        iam.get_role(RoleName=role)
    except iam.exceptions.NoSuchEntityException:
        return False
    return True


def sa_annotation(kube, namespace: str, sa: str) -> str | None:
    found = get(kube, "serviceaccount", namespace, sa)
    assert found is not None, f"ServiceAccount {sa} is gone"
    return (found["metadata"].get("annotations") or {}).get(iam_names.ROLE_ANNOTATION)


def refused(call) -> bool:
    try:
        call()
    except botocore.exceptions.ClientError as exc:
        code = exc.response["Error"]["Code"]
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        assert status == 403 or code in ("AccessDenied", "AccessDeniedException"), exc
        return True
    return False


def statement(document: dict) -> dict:
    assert len(document["Statement"]) == 1, document
    return document["Statement"][0]


def test_grants_reach_exactly_the_granted_bucket_and_queue(kube, cloud, access_namespace):
    ns = access_namespace
    kube.kubectl("create", "serviceaccount", "app", "-n", ns)
    apply(
        kube,
        ns,
        manifests(
            [
                ("S3Bucket", "granted", "{access: [{serviceAccountName: app, level: read}]}"),
                ("S3Bucket", "other", "{forceDestroy: true}"),
                ("Queue", "jobs", "{access: [{serviceAccountName: app, level: write}]}"),
                ("Queue", "elsewhere", "{}"),
            ]
        ),
    )
    crs = {
        n: wait_ready(kube, k, ns, n)
        for k, n in [
            ("s3b", "granted"),
            ("s3b", "other"),
            ("queue", "jobs"),
            ("queue", "elsewhere"),
        ]
    }
    role = role_name(ns, "app")
    arn = f"arn:aws:iam::{ACCOUNT}:role/provisioner/{role}"
    for name, level in [("granted", "read"), ("jobs", "write")]:
        assert crs[name]["status"]["access"] == [
            {"serviceAccountName": "app", "level": level, "roleArn": arn}
        ]
    assert sa_annotation(kube, ns, "app") == arn

    # The documents: only the granted ARNs, only the level's actions.
    bucket_arn, queue_arn = crs["granted"]["status"]["arn"], crs["jobs"]["status"]["arn"]
    docs = policies(cloud, role)
    assert set(docs) == {
        iam_names.policy_name("S3Bucket", "granted", crs["granted"]["metadata"]["uid"]),
        iam_names.policy_name("Queue", "jobs", crs["jobs"]["metadata"]["uid"]),
    }
    by_resource = {tuple(statement(d)["Resource"]): statement(d) for d in docs.values()}
    assert set(by_resource) == {(bucket_arn, f"{bucket_arn}/*"), (queue_arn,)}
    assert not READ_ONLY_S3 & set(by_resource[(bucket_arn, f"{bucket_arn}/*")]["Action"])
    assert "sqs:SendMessage" in by_resource[(queue_arn,)]["Action"]
    assert "sqs:DeleteQueue" not in by_resource[(queue_arn,)]["Action"]
    described = cloud.client("iam").get_role(RoleName=role)["Role"]
    trust = statement(described["AssumeRolePolicyDocument"])
    issuer = ISSUER.removeprefix("https://")
    assert trust["Principal"] == {"Federated": f"arn:aws:iam::{ACCOUNT}:oidc-provider/{issuer}"}
    assert trust["Condition"] == {
        "StringEquals": {
            f"{issuer}:sub": f"system:serviceaccount:{ns}:app",
            f"{issuer}:aud": "sts.amazonaws.com",
        }
    }
    assert {t["Key"]: t["Value"] for t in described["Tags"]} == {
        "provisioner.dev/cluster": CLUSTER_ID,
        "provisioner.dev/namespace": ns,
        "provisioner.dev/service-account": "app",
    }

    # With IAM enforcement: what the pod's credentials may do.
    admin_s3 = cloud.client("s3")
    granted, other = (
        crs["granted"]["status"]["externalName"],
        crs["other"]["status"]["externalName"],
    )
    admin_s3.put_object(Bucket=granted, Key="report.txt", Body=b"hello")
    admin_s3.put_object(Bucket=other, Key="report.txt", Body=b"secret")
    pod = cloud.web_identity(arn)
    s3 = pod.client("s3", endpoint_url=cloud.moto.url)
    assert s3.get_object(Bucket=granted, Key="report.txt")["Body"].read() == b"hello"
    assert refused(lambda: s3.put_object(Bucket=granted, Key="new.txt", Body=b"x"))
    assert refused(lambda: s3.get_object(Bucket=other, Key="report.txt"))
    assert refused(lambda: s3.put_object(Bucket=other, Key="new.txt", Body=b"x"))
    sqs = pod.client("sqs", endpoint_url=cloud.moto.url)
    jobs_url = crs["jobs"]["status"]["queueUrl"]
    sqs.send_message(QueueUrl=jobs_url, MessageBody="job-1")
    received = wait_for(
        lambda: sqs.receive_message(QueueUrl=jobs_url, WaitTimeSeconds=1).get("Messages"),
        what="the message sent by the pod",
    )
    assert received[0]["Body"] == "job-1"
    elsewhere_url = crs["elsewhere"]["status"]["queueUrl"]
    assert refused(lambda: sqs.send_message(QueueUrl=elsewhere_url, MessageBody="x"))
    assert refused(lambda: sqs.receive_message(QueueUrl=elsewhere_url))

    # Widen read -> write: the pod may now write the bucket (and still not the other).
    generation = crs["granted"]["metadata"]["generation"] + 1
    merge_patch(
        kube,
        "s3b",
        ns,
        "granted",
        '{"spec":{"access":[{"serviceAccountName":"app","level":"write"}]}}',
    )
    wait_ready(kube, "s3b", ns, "granted", generation=generation)
    s3.put_object(Bucket=granted, Key="new.txt", Body=b"x")
    assert refused(lambda: s3.put_object(Bucket=other, Key="new.txt", Body=b"x"))
    # Narrow it back: writing is refused again.
    merge_patch(
        kube,
        "s3b",
        ns,
        "granted",
        '{"spec":{"access":[{"serviceAccountName":"app","level":"read"}]}}',
    )
    wait_ready(kube, "s3b", ns, "granted", generation=generation + 1)
    assert refused(lambda: s3.put_object(Bucket=granted, Key="again.txt", Body=b"x"))

    # Remove the queue's grant: its policy goes, the role stays for the bucket's.
    merge_patch(kube, "queue", ns, "jobs", '{"spec":{"access":null}}')
    wait_for(
        lambda: (o := get(kube, "queue", ns, "jobs")) and o["status"].get("access") == [],
        what="the queue's grant to leave status.access",
    )
    assert len(policies(cloud, role)) == 1
    assert refused(lambda: sqs.send_message(QueueUrl=jobs_url, MessageBody="x"))
    assert sa_annotation(kube, ns, "app") == arn

    # Delete the bucket: access goes first, even while the bucket's own deletion waits (it
    # holds objects); the last policy takes the role and the annotation with it.
    kube.kubectl("delete", "s3b", "granted", "-n", ns, "--wait=false")
    wait_condition(kube, "s3b", ns, "granted", "Ready", "False", "Deleting")
    assert not role_exists(cloud, role)
    assert sa_annotation(kube, ns, "app") is None
    merge_patch(kube, "s3b", ns, "granted", '{"spec":{"forceDestroy":true}}')
    wait_gone(kube, "s3b", ns, "granted")


def test_two_resources_share_one_role_and_a_recreated_service_account_is_annotated_again(
    kube, cloud, access_namespace
):
    ns = access_namespace
    kube.kubectl("create", "serviceaccount", "shared", "-n", ns)
    grant = "{access: [{serviceAccountName: shared, level: write}]}"
    apply(kube, ns, manifests([("Topic", "alerts", grant), ("Topic", "audit", grant)]))
    alerts, audit = (wait_ready(kube, "topic", ns, n) for n in ("alerts", "audit"))
    role = role_name(ns, "shared")
    docs = policies(cloud, role)
    assert {tuple(statement(d)["Resource"]) for d in docs.values()} == {
        (alerts["status"]["arn"],),
        (audit["status"]["arn"],),
    }
    assert all("sns:Publish" in statement(d)["Action"] for d in docs.values())
    arn = alerts["status"]["access"][0]["roleArn"]
    assert audit["status"]["access"][0]["roleArn"] == arn

    # The ServiceAccount deleted: the resource says so; recreated: annotated again.
    kube.kubectl("delete", "serviceaccount", "shared", "-n", ns)
    wait_condition(kube, "topic", ns, "alerts", "Synced", "False", "ServiceAccountNotFound")
    assert condition(get(kube, "topic", ns, "alerts"), "Ready")["status"] == "True"
    kube.kubectl("create", "serviceaccount", "shared", "-n", ns)
    wait_for(lambda: sa_annotation(kube, ns, "shared") == arn, what="the annotation again")
    wait_ready(kube, "topic", ns, "alerts")

    # One of the two deleted: the role keeps the other's policy; both: the role goes.
    kube.kubectl("delete", "topic", "alerts", "-n", ns)
    assert [tuple(statement(d)["Resource"]) for d in policies(cloud, role).values()] == [
        (audit["status"]["arn"],)
    ]
    assert sa_annotation(kube, ns, "shared") == arn
    kube.kubectl("delete", "topic", "audit", "-n", ns)
    assert not role_exists(cloud, role)
    assert sa_annotation(kube, ns, "shared") is None


def test_an_annotation_or_a_role_of_someone_else_is_never_taken_over(kube, cloud, access_namespace):
    ns = access_namespace
    theirs = f"arn:aws:iam::{ACCOUNT}:role/their-own"
    kube.kubectl("create", "serviceaccount", "taken", "-n", ns)
    kube.kubectl(
        "annotate", "serviceaccount", "taken", "-n", ns, f"{iam_names.ROLE_ANNOTATION}={theirs}"
    )
    kube.kubectl("create", "serviceaccount", "squatted", "-n", ns)
    squatted_role = role_name(ns, "squatted")
    cloud.client("iam").create_role(
        RoleName=squatted_role,
        Path="/provisioner/",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )
    apply(
        kube,
        ns,
        manifests(
            [
                ("S3Bucket", "for-taken", "{access: [{serviceAccountName: taken}]}"),
                ("S3Bucket", "for-squatted", "{access: [{serviceAccountName: squatted}]}"),
            ]
        ),
    )
    for name, needle in [("for-taken", theirs), ("for-squatted", squatted_role)]:
        cr = wait_condition(kube, "s3b", ns, name, "Synced", "False", "AccessConflict")
        assert needle in condition(cr, "Synced")["message"]
        assert condition(cr, "Ready")["status"] == "True"  # the bucket itself serves
        assert not cr["status"].get("access")
    assert sa_annotation(kube, ns, "taken") == theirs
    assert not role_exists(cloud, role_name(ns, "taken"))
    assert policies(cloud, squatted_role) == {}
    # Deleting them touches neither.
    kube.kubectl("delete", "s3b", "for-taken", "for-squatted", "-n", ns)
    assert sa_annotation(kube, ns, "taken") == theirs
    assert role_exists(cloud, squatted_role)


@pytest.mark.parametrize("point", ["after-create-role", "after-put-policy", "after-delete-policy"])
def test_killed_between_the_iam_calls_converges_to_one_role(kube, cluster, cloud, point):
    """SIGKILL between CreateRole and PutRolePolicy, between PutRolePolicy and the annotation,
    and, at deletion, between DeleteRolePolicy and DeleteRole: one role while granted,
    nothing left once the resource is gone."""
    deleting = point == "after-delete-policy"
    with own_namespace(cluster, "own-access-kill") as ns, operators(cluster, ns) as start:
        kube.kubectl("create", "serviceaccount", "worker", "-n", ns)
        role = role_name(ns, "worker")
        doomed = start_access_operator(start, cloud, env={"PROVISIONER_CRASHPOINTS": point})
        apply(
            kube,
            ns,
            manifests([("Queue", "tasks", "{access: [{serviceAccountName: worker}]}")]),
        )
        if deleting:
            wait_ready(kube, "queue", ns, "tasks")
            kube.kubectl("delete", "queue", "tasks", "-n", ns, "--wait=false")
        wait_killed(doomed)
        assert role_exists(cloud, role)
        if deleting:
            assert policies(cloud, role) == {}  # the policy went, the role not yet
        else:
            assert sa_annotation(kube, ns, "worker") is None
            # Recorded before the create: the grant is known whatever happens next.
            (entry,) = get(kube, "queue", ns, "tasks")["status"]["access"]
            assert entry["serviceAccountName"] == "worker"
        start_access_operator(start, cloud)
        if not deleting:
            cr = wait_ready(kube, "queue", ns, "tasks")
            assert sa_annotation(kube, ns, "worker") == cr["status"]["access"][0]["roleArn"]
            listed = cloud.client("iam").list_roles(PathPrefix="/provisioner/")["Roles"]
            assert [r["RoleName"] for r in listed if r["RoleName"].startswith(f"{ns}-")] == [role]
            assert len(policies(cloud, role)) == 1
            kube.kubectl("delete", "queue", "tasks", "-n", ns, "--wait=false")
        wait_gone(kube, "queue", ns, "tasks")
        assert not role_exists(cloud, role)
        assert sa_annotation(kube, ns, "worker") is None


def test_access_is_refused_where_the_operator_grants_none(kube, namespace, operator):
    """The session operator runs with --access=off: the bucket is made, the grant refused."""
    apply(kube, namespace, manifests([("S3Bucket", "b", "{access: [{serviceAccountName: app}]}")]))
    cr = wait_condition(kube, "s3b", namespace, "b", "Synced", "False", "AccessDisabled")
    assert condition(cr, "Ready")["status"] == "True"
    assert "--access=off" in condition(cr, "Synced")["message"]


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("{serviceAccountName: app, namespace: other}", 'unknown field "spec.access[0].namespace"'),
        ("{serviceAccountName: app, level: owner}", "Unsupported value"),
        ("{level: read}", "serviceAccountName: Required value"),
    ],
)
def test_access_entries_are_validated_by_the_api_server(kube, namespace, entry, needle):
    result = try_apply(kube, namespace, manifests([("Queue", "q", f"{{access: [{entry}]}}")]))
    assert_refused(result, needle)


def test_the_same_service_account_twice_is_refused(kube, namespace):
    twice = "{access: [{serviceAccountName: app}, {serviceAccountName: app, level: write}]}"
    assert_refused(
        try_apply(kube, namespace, manifests([("Topic", "t", twice)])), "Duplicate value"
    )
