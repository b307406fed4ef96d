"""The aws-like cloud profile: boto3 against moto's server behind provisioner_dev.awslike.

Durations run at time scale 300 with fixed values (AWS seconds / 300 = what a test waits), so
every state is visible for a second or more and the whole file runs in seconds. Assertions
are on what boto3 sees; `moto` (boto3 straight at moto's server) shows what is stored.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.config
import botocore.exceptions
import pytest

from provisioner.aws.budget import BudgetSettings, Limit
from provisioner.aws.session import Aws, AwsSettings
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.cloud import create_role
from tests.helpers import wait_for

pytestmark = pytest.mark.cloud

SCALE = 300
# Real seconds each state lasts at this scale, and the --duration flags (AWS seconds) for them.
SECONDS = {
    "rds.create": 1.5,
    "rds.backup": 1.5,
    "rds.modify": 1.5,
    "rds.reset_password": 1.5,
    "rds.storage_optimization": 1.5,
    "rds.storage_cooldown": 3.5,
    "rds.snapshot": 1.5,
    "rds.delete": 1.5,
    "sqs.deleted_name": 1.5,
    "sqs.attributes": 1.5,
    "sqs.retention": 3.0,
    "s3.deleted_name": 1.5,
}
DURATIONS = [f"--duration={name}={seconds * SCALE:g}" for name, seconds in SECONDS.items()]
NO_RETRIES = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"})
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _proxy(moto_url: str, log: Path, *extra: str) -> Iterator[AwsLikeProxy]:
    proxy = AwsLikeProxy(
        upstream=moto_url, args=[f"--time-scale={SCALE}", *DURATIONS, *extra], log=log, seed=7
    )
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def proxy(moto_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsLikeProxy]:
    yield from _proxy(moto_url, tmp_path_factory.mktemp("awslike") / "proxy.log")


@pytest.fixture(scope="module")
def tight(moto_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsLikeProxy]:
    """The same profile with small buckets, to be throttled within a test."""
    yield from _proxy(
        moto_url,
        tmp_path_factory.mktemp("awslike-tight") / "proxy.log",
        "--throttle=rds.*=3:2",
        "--throttle=sqs.tagging=2:2",
        "--throttle=s3.write=2:2",
    )


def client(service: str, url: str, **credentials: str):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        config=NO_RETRIES,
        **(credentials or CREDENTIALS),
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def error_of(call, *args, **kwargs) -> tuple[str, int]:
    """(code, HTTP status) of the error boto3 raises for this call."""
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call(*args, **kwargs)
    response = raised.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def succeeds(call, *args, refused: str, **kwargs) -> bool:
    """Whether the call went through; False when refused with exactly `refused`."""
    try:
        call(*args, **kwargs)
    except botocore.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] != refused:
            raise
        return False
    return True


def db_states(rds, ident: str, until: str, timeout: float = 30) -> list[tuple[str, dict]]:
    """Distinct consecutive (status, instance) seen until `until`, polling quickly."""
    seen: list[tuple[str, dict]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            instance = rds.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
            status = instance["DBInstanceStatus"]
        except rds.exceptions.DBInstanceNotFoundFault:
            instance, status = {}, "not-found"
        if not seen or seen[-1][0] != status:
            seen.append((status, instance))
        if status == until:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{ident} never {until} in {timeout}s; seen {[s for s, _ in seen]}")


def create_db(rds, ident: str) -> dict:
    return rds.create_db_instance(
        DBInstanceIdentifier=ident,
        Engine="postgres",
        DBInstanceClass="db.t3.micro",
        AllocatedStorage=20,
        MasterUsername="app",
        MasterUserPassword="not-a-real-password-1",
    )["DBInstance"]


def test_rds_instance_is_creating_then_backing_up_then_available(proxy):
    rds, ident = client("rds", proxy.url), name("db")
    started = time.monotonic()
    created = create_db(rds, ident)
    assert created["DBInstanceStatus"] == "creating"
    assert "Endpoint" not in created
    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["creating", "backing-up", "available"]
    assert "Endpoint" not in seen[0][1] and seen[1][1]["Endpoint"]["Port"] == 5432
    assert time.monotonic() - started >= SECONDS["rds.create"] + SECONDS["rds.backup"] - 0.1


def test_rds_modification_shows_the_old_values_until_applied(proxy, moto_url):
    rds, moto, ident = client("rds", proxy.url), client("rds", moto_url), name("db")
    create_db(rds, ident)
    db_states(rds, ident, "available")
    answer = rds.modify_db_instance(
        DBInstanceIdentifier=ident,
        DBInstanceClass="db.t3.small",
        AllocatedStorage=30,
        ApplyImmediately=True,
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "modifying"
    assert answer["PendingModifiedValues"] == {
        "DBInstanceClass": "db.t3.small",
        "AllocatedStorage": 30,
    }
    # moto stores the new values at once; the profile only changes what is shown.
    stored = moto.describe_db_instances(DBInstanceIdentifier=ident)["DBInstances"][0]
    assert (stored["DBInstanceClass"], stored["AllocatedStorage"]) == ("db.t3.small", 30)
    assert error_of(
        rds.modify_db_instance, DBInstanceIdentifier=ident, MultiAZ=True, ApplyImmediately=True
    ) == ("InvalidDBInstanceState", 400)

    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["modifying", "storage-optimization", "available"]
    modifying, optimizing = seen[0][1], seen[1][1]
    assert (modifying["DBInstanceClass"], modifying["AllocatedStorage"]) == ("db.t3.micro", 20)
    assert modifying["PendingModifiedValues"]["AllocatedStorage"] == 30
    assert (optimizing["DBInstanceClass"], optimizing["AllocatedStorage"]) == ("db.t3.small", 30)
    assert not optimizing.get("PendingModifiedValues")
    # No new storage change until the cooldown has passed, whatever the status says.
    code = error_of(
        rds.modify_db_instance,
        DBInstanceIdentifier=ident,
        AllocatedStorage=40,
        ApplyImmediately=True,
    )
    assert code == ("InvalidParameterCombination", 400)
    wait_for(
        lambda: succeeds(
            rds.modify_db_instance,
            DBInstanceIdentifier=ident,
            AllocatedStorage=40,
            ApplyImmediately=True,
            refused="InvalidParameterCombination",
        ),
        timeout=SECONDS["rds.storage_cooldown"] + 10,
        what="a storage change accepted after the cooldown",
        every=0.1,
    )


def test_rds_password_change_resets_master_credentials(proxy):
    rds, ident = client("rds", proxy.url), name("db")
    create_db(rds, ident)
    db_states(rds, ident, "available")
    answer = rds.modify_db_instance(
        DBInstanceIdentifier=ident, MasterUserPassword="another-password-2", ApplyImmediately=True
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "resetting-master-credentials"
    assert answer["PendingModifiedValues"] == {"MasterUserPassword": "****"}
    seen = db_states(rds, ident, "available")
    assert [status for status, _ in seen] == ["resetting-master-credentials", "available"]


def test_rds_deletion_takes_a_final_snapshot_then_the_instance_is_gone(proxy, moto_url):
    rds, moto, ident = client("rds", proxy.url), client("rds", moto_url), name("db")
    create_db(rds, ident)
    db_states(rds, ident, "available")
    snapshot = f"{ident}-final"
    answer = rds.delete_db_instance(
        DBInstanceIdentifier=ident, FinalDBSnapshotIdentifier=snapshot, SkipFinalSnapshot=False
    )["DBInstance"]
    assert answer["DBInstanceStatus"] == "deleting"
    assert error_of(moto.describe_db_instances, DBInstanceIdentifier=ident)[0] == (
        "DBInstanceNotFound"
    )
    listed = [i["DBInstanceIdentifier"] for i in rds.describe_db_instances()["DBInstances"]]
    assert ident in listed
    assert error_of(create_db, rds, ident) == ("DBInstanceAlreadyExists", 400)

    def snapshot_status() -> str:
        found = rds.describe_db_snapshots(DBSnapshotIdentifier=snapshot)["DBSnapshots"]
        return found[0]["Status"]

    assert snapshot_status() == "creating"
    wait_for(lambda: snapshot_status() == "available", timeout=20, what="snapshot available")
    seen = db_states(rds, ident, "not-found")
    assert [status for status, _ in seen] == ["deleting", "not-found"]
    create_db(rds, ident)  # the identifier is free again


def test_sqs_refuses_a_name_deleted_less_than_a_minute_ago(proxy):
    sqs, queue = client("sqs", proxy.url), name("q")
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    assert url.startswith(proxy.url)  # queue URLs name the endpoint the client spoke to
    sqs.delete_queue(QueueUrl=url)
    deleted = time.monotonic()
    code = error_of(sqs.create_queue, QueueName=queue)
    assert code == ("AWS.SimpleQueueService.QueueDeletedRecently", 400)
    wait_for(
        lambda: succeeds(
            sqs.create_queue,
            QueueName=queue,
            refused="AWS.SimpleQueueService.QueueDeletedRecently",
        ),
        timeout=20,
        what="name free",
        every=0.1,
    )
    assert time.monotonic() - deleted >= SECONDS["sqs.deleted_name"] - 0.1


def test_sqs_attributes_show_their_old_values_for_a_while(proxy, moto_url):
    sqs, moto = client("sqs", proxy.url), client("sqs", moto_url)
    url = sqs.create_queue(QueueName=name("q"), Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"VisibilityTimeout": "45", "MessageRetentionPeriod": "600"}
    )

    def attributes() -> dict[str, str]:
        return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

    first = attributes()
    assert (first["VisibilityTimeout"], first["MessageRetentionPeriod"]) == ("30", "345600")
    stored = moto.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (stored["VisibilityTimeout"], stored["MessageRetentionPeriod"]) == ("45", "600")
    # Most attributes within a minute, the retention period within 15 (scaled).
    middle = wait_for(
        lambda: (a := attributes())["VisibilityTimeout"] == "45" and a,
        timeout=20,
        what="new visibility timeout",
        every=0.05,
    )
    assert middle["MessageRetentionPeriod"] == "345600"
    wait_for(
        lambda: attributes()["MessageRetentionPeriod"] == "600", timeout=20, what="new retention"
    )


def test_s3_refuses_a_deleted_buckets_name_for_a_while(proxy):
    s3, bucket = client("s3", proxy.url), name("bucket")
    s3.create_bucket(Bucket=bucket)
    s3.delete_bucket(Bucket=bucket)
    assert error_of(s3.create_bucket, Bucket=bucket) == ("OperationAborted", 409)
    wait_for(
        lambda: succeeds(s3.create_bucket, Bucket=bucket, refused="OperationAborted"),
        timeout=20,
        what="bucket name free",
        every=0.1,
    )


TRUST_ANYONE = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
)


def assumed_role_credentials(url: str, moto_url: str) -> dict[str, str]:
    """Credentials moto files under another account (111122223333), assumed through `url`."""
    sts = client("sts", url)
    role = create_role(moto_url, "111122223333", "awslike-test", TRUST_ANYONE)
    found = sts.assume_role(RoleArn=role, RoleSessionName="awslike-test")["Credentials"]
    return {
        "aws_access_key_id": found["AccessKeyId"],
        "aws_secret_access_key": found["SecretAccessKey"],
        "aws_session_token": found["SessionToken"],
    }


def test_assume_role_is_refused_as_aws_refuses_it(proxy, moto_url):
    """AccessDenied (403) for a role that does not exist in its account, or an ExternalId its
    trust policy does not name; granted otherwise, in the role's account."""
    sts = client("sts", proxy.url)
    missing = f"arn:aws:iam::111122223333:role/{name('missing')}"
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        sts.assume_role(RoleArn=missing, RoleSessionName="t1")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "not authorized to perform: sts:AssumeRole" in str(refused.value)
    trust = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": "*"},
                    "Action": "sts:AssumeRole",
                    "Condition": {"StringEquals": {"sts:ExternalId": "right-one"}},
                }
            ],
        }
    )
    role = create_role(moto_url, "111122223333", name("ext"), trust)
    with pytest.raises(botocore.exceptions.ClientError):
        sts.assume_role(RoleArn=role, RoleSessionName="t2", ExternalId="wrong-one")
    granted = sts.assume_role(RoleArn=role, RoleSessionName="t3", ExternalId="right-one")
    assert granted["AssumedRoleUser"]["Arn"].startswith("arn:aws:sts::111122223333:assumed-role/")


def test_rds_throttles_per_account_and_action_with_its_own_code(tight, moto_url):
    rds = client("rds", tight.url)
    before = tight.stats()["throttles_by_action"].get("rds.DescribeDBInstances", 0)
    answers = []
    for _ in range(6):
        try:
            rds.describe_db_instances()
            answers.append("ok")
        except botocore.exceptions.ClientError as exc:
            error = exc.response
            answers.append((error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]))
    assert answers[:3] == ["ok"] * 3  # the burst
    assert ("Throttling", 400) in answers[3:]
    rds.describe_db_snapshots()  # another action: a bucket of its own
    other = client("rds", tight.url, **assumed_role_credentials(tight.url, moto_url))
    other.describe_db_instances()  # another account: buckets of its own
    wait_for(
        lambda: succeeds(rds.describe_db_instances, refused="Throttling"),
        timeout=10,
        what="a refilled token",
        every=0.2,
    )
    stats = tight.stats()
    assert stats["throttles_by_action"]["rds.DescribeDBInstances"] > before
    assert "111122223333" in stats["accounts"].values()


def test_sqs_tagging_throttles_with_request_throttled_and_other_actions_do_not(tight):
    sqs = client("sqs", tight.url)
    url = sqs.create_queue(QueueName=name("q"))["QueueUrl"]
    codes = set()
    for _ in range(6):
        try:
            sqs.list_queue_tags(QueueUrl=url)
        except botocore.exceptions.ClientError as exc:
            codes.add(
                (exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"])
            )
    assert codes == {("RequestThrottled", 403)}
    for _ in range(10):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])


def test_s3_throttles_writes_per_bucket_with_slow_down(tight):
    s3 = client("s3", tight.url)
    first, second = name("bucket"), name("bucket")
    for bucket in (first, second):
        s3.create_bucket(Bucket=bucket)
    tags = {"TagSet": [{"Key": "k", "Value": "v"}]}
    codes = set()
    for _ in range(4):
        try:
            s3.put_bucket_tagging(Bucket=first, Tagging=tags)
        except botocore.exceptions.ClientError as exc:
            codes.add(
                (exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"])
            )
    assert codes == {("SlowDown", 503)}
    s3.get_bucket_tagging(Bucket=first)  # reads have their own bucket
    s3.put_bucket_tagging(Bucket=second, Tagging=tags)  # another bucket: its own buckets


def test_the_operators_call_budget_absorbs_the_clouds_throttling(tight, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    # A budget four times the cloud's real limit: the cloud throttles, the budget shrinks.
    budget = BudgetSettings(limits={"rds": Limit(burst=12, rate=8)}, max_throttled_seconds=30)
    aws = Aws(AwsSettings(region="us-east-1", endpoint_url=tight.url, budget=budget))
    rds = aws.client("rds")
    before = tight.stats()["throttles_by_action"].get("rds.DescribeDBSnapshots", 0)
    results, failures = [], []

    def worker():
        for _ in range(3):
            try:
                results.append(aws.call(rds.describe_db_snapshots, SnapshotType="manual"))
            except Exception as exc:  # noqa: BLE001 - any failure fails the test below
                failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == [] and len(results) == 12
    throttled = tight.stats()["throttles_by_action"].get("rds.DescribeDBSnapshots", 0) - before
    assert throttled > 0
    assert aws.budget.snapshot()[0]["rate"] < 8
