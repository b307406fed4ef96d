"""CloudAccounts: resources in several AWS accounts, tenant isolation, no restart for changes.

A stack of the module's own (control plane, moto) with an operator watching every namespace,
so that it also keeps CloudAccounts' status and finalizer (the session operator watches a
glob of namespaces and only reads them). The operator talks to the aws-like proxy, which
refuses an AssumeRole the way AWS does when the role does not exist in its account; moto
itself lets anyone assume anything. The tests create the roles in moto's IAM of each account
and read each account's resources with boto3 as that account.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from provisioner_dev.awsenv import DEV_REGION, aws_env
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.cloud import cloud_account, create_role, in_account
from provisioner_dev.launch import OperatorProcess
from provisioner_dev.processes import free_port
from tests.conftest import (
    TEST_CLOUD,
    TEST_RESYNC_SECONDS,
    Cluster,
    needs_own_controlplane,
    running_cluster,
)
from tests.e2e.test_observability import sample, scrape
from tests.helpers import (
    condition,
    events,
    get,
    manifests,
    resource_class,
    secret_data,
    wait_condition,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(TEST_CLOUD != "moto", reason="moto serves many accounts by AssumeRole"),
    # Its operator acts cluster-wide, beside the session's: on a cluster of its own only.
    needs_own_controlplane,
]

ACCOUNT_A, ACCOUNT_B, ACCOUNT_C = "111111111111", "222222222222", "333333333333"
ROLE = "provisioner"


@dataclass
class Env:
    kube: Cluster
    proxy: AwsLikeProxy
    operator: OperatorProcess
    metrics_port: int

    def as_account(self, account: str, service: str, region: str = DEV_REGION) -> Any:
        """A boto3 client acting in `account`, straight to moto (not through the proxy)."""
        return in_account(self.kube.moto.url, account, "test-reader").client(service, region)

    def assume_role_calls(self) -> int:
        return int(self.proxy.stats()["calls_by_action"].get("sts.AssumeRole", 0))


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_cluster() as kube:
        # RDS at a time scale where its 5-minute create takes half a second.
        proxy = AwsLikeProxy(
            upstream=kube.moto.url,
            args=["--time-scale=600"],
            seed=5,
            log=kube.dir / "awslike.log",
        )
        proxy.start()
        port = free_port()
        operator = kube.stack.start_operator(
            endpoint_url=proxy.url,
            log=kube.dir / "operator-accounts.log",
            args=[f"--resync-seconds={TEST_RESYNC_SECONDS}", f"--metrics-port={port}"],
            cluster_id="test",
        )
        e = Env(kube, proxy, operator, port)
        for account in (ACCOUNT_A, ACCOUNT_B, ACCOUNT_C):
            create_role(kube.moto.url, account, ROLE)
        try:
            yield e
        finally:
            operator.stop()
            proxy.stop()


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def namespace(env: Env, team: str, annotations: dict[str, str] | None = None) -> str:
    name = f"{team}-{suffix()}"
    env.kube.kubectl("create", "namespace", name)
    env.kube.kubectl("label", "namespace", name, f"team={team}")
    for key, value in (annotations or {}).items():
        env.kube.kubectl("annotate", "namespace", name, f"{key}={value}")
    return name


def apply_account(
    env: Env,
    name: str,
    account: str,
    team: str,
    *,
    label: str = "team",
    role: str = ROLE,
    regions: list[str] | None = None,
    default_region: str | None = None,
) -> None:
    """A CloudAccount `name` for `role` in `account`, selecting namespaces labelled
    `label=team`."""
    body = cloud_account(
        name,
        f"arn:aws:iam::{account}:role/{role}",
        {label: team},
        regions=regions,
        default_region=default_region,
    )
    env.kube.kubectl("apply", "-f", "-", input=json.dumps(body))


def apply_in(env: Env, ns: str, docs: list[tuple[str, str, str]]) -> None:
    env.kube.kubectl("apply", "-n", ns, "-f", "-", input=manifests(docs))


def queues_in(env: Env, account: str) -> list[str]:
    return list(env.as_account(account, "sqs").list_queues().get("QueueUrls", []))


def names_everywhere(env: Env, needle: str) -> list[str]:
    """Every queue URL, bucket and DB instance in any of the accounts that contains `needle`."""
    found = []
    for account in (ACCOUNT_A, ACCOUNT_B, ACCOUNT_C, "123456789012"):
        found += [u for u in queues_in(env, account) if needle in u]
        buckets = env.as_account(account, "s3").list_buckets().get("Buckets", [])
        found += [b["Name"] for b in buckets if needle in b["Name"]]
        dbs = env.as_account(account, "rds").describe_db_instances()["DBInstances"]
        found += [d["DBInstanceIdentifier"] for d in dbs if needle in d["DBInstanceIdentifier"]]
    return found


THREE_KINDS: list[tuple[str, str, dict[str, Any]]] = [
    ("Queue", "q", {}),
    ("S3Bucket", "b", {}),
    ("DatabaseInstance", "db", {"engine": "postgres", "instanceClass": "db.t3.micro"}),
]


def cloudaccount(env: Env, name: str) -> dict[str, Any] | None:
    found = env.kube.kubectl("get", "cloudaccount", name, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def test_each_namespace_s_resources_land_in_its_own_account(env):
    """Two teams, two accounts: every resource lands in its team's account (ARNs and URLs say
    so, each account's listing has only its own), and status and Secrets say where."""
    a, b = f"team-a-{suffix()}", f"team-b-{suffix()}"
    ns_a, ns_b = namespace(env, a), namespace(env, b)
    apply_account(env, a, ACCOUNT_A, a)
    apply_account(env, b, ACCOUNT_B, b)
    for ns, account_name in ((ns_a, a), (ns_b, b)):
        docs = [(k, n, json.dumps({**spec, "account": account_name})) for k, n, spec in THREE_KINDS]
        apply_in(env, ns, docs)
    for ns, account in ((ns_a, ACCOUNT_A), (ns_b, ACCOUNT_B)):
        for kind, name, _ in THREE_KINDS:
            obj = wait_ready(env.kube, kind, ns, name, timeout=90)
            assert obj["status"]["accountId"] == account
            if kind != "S3Bucket":  # a bucket's ARN names no account
                assert f":{account}:" in obj["status"]["arn"], obj["status"]["arn"]
        queue = get(env.kube, "Queue", ns, "q")
        assert f"/{account}/" in queue["status"]["queueUrl"]
        secret = secret_data(env.kube, ns, "q-connection")
        assert secret is not None and f"/{account}/" in secret["queueUrl"]
    mine_a = [u for u in queues_in(env, ACCOUNT_A) if ns_a in u or ns_b in u]
    mine_b = [u for u in queues_in(env, ACCOUNT_B) if ns_a in u or ns_b in u]
    assert len(mine_a) == 1 and ns_a in mine_a[0], mine_a
    assert len(mine_b) == 1 and ns_b in mine_b[0], mine_b
    ready = env.kube.kubectl("get", "cacc", a).stdout
    assert re.search(rf"{a}\s+True\s+{ACCOUNT_A}\s+arn:aws:iam::{ACCOUNT_A}:role/{ROLE}", ready), (
        ready
    )
    assert cloudaccount(env, a)["status"]["assumedArn"].startswith(
        f"arn:aws:sts::{ACCOUNT_A}:assumed-role/{ROLE}/"
    )
    for ns in (ns_a, ns_b):
        env.kube.kubectl("delete", "-n", ns, "queue,s3bucket,databaseinstance", "--all")
    assert wait_for(
        lambda: not names_everywhere(env, ns_a) and not names_everywhere(env, ns_b),
        timeout=60,
        what="every resource deleted in its account",
    )


def test_another_team_s_account_is_refused_with_no_cloud_call(env):
    a, b = f"team-a-{suffix()}", f"team-b-{suffix()}"
    namespace(env, a)
    ns_b = namespace(env, b)
    apply_account(env, a, ACCOUNT_A, a)
    apply_in(env, ns_b, [("Queue", "stolen", f"{{account: {a}}}")])
    obj = wait_condition(env.kube, "Queue", ns_b, "stolen", "Synced", "False", "AccountNotAllowed")
    assert f"does not select namespace {ns_b}" in condition(obj, "Synced")["message"]
    assert names_everywhere(env, ns_b) == []
    assert "accountId" not in obj["status"]
    # Relabelled into the team: taken up within seconds, no restart.
    env.kube.kubectl("label", "namespace", ns_b, f"team={a}", "--overwrite")
    obj = wait_ready(env.kube, "Queue", ns_b, "stolen", timeout=30)
    assert obj["status"]["accountId"] == ACCOUNT_A
    env.kube.kubectl("delete", "-n", ns_b, "queue", "stolen")
    wait_gone(env.kube, "Queue", ns_b, "stolen")


def test_namespace_default_override_regions_and_an_account_made_later(env):
    a, c = f"team-a-{suffix()}", f"team-c-{suffix()}"
    ns = namespace(env, a, {"cloud.provisioner.dev/default-account": a})
    env.kube.kubectl("label", "namespace", ns, f"team-c={c}")
    apply_account(
        env, a, ACCOUNT_A, a, regions=["us-east-1", "eu-west-1"], default_region="eu-west-1"
    )
    apply_in(
        env,
        ns,
        [
            ("Queue", "by-default", "{}"),
            ("Queue", "elsewhere", "{region: ap-south-1}"),
            ("Queue", "overridden", f"{{account: {c}}}"),
        ],
    )
    obj = wait_ready(env.kube, "Queue", ns, "by-default")
    assert obj["status"]["accountId"] == ACCOUNT_A and obj["status"]["region"] == "eu-west-1"
    assert "sqs.eu-west-1" in obj["status"]["arn"] or ":eu-west-1:" in obj["status"]["arn"]
    refused = wait_condition(
        env.kube, "Queue", ns, "elsewhere", "Synced", "False", "RegionNotAllowed"
    )
    assert "ap-south-1 is not allowed" in condition(refused, "Synced")["message"]
    wait_condition(env.kube, "Queue", ns, "overridden", "Synced", "False", "AccountNotFound")
    # The CloudAccount it names appears: taken up within seconds.
    apply_account(env, c, ACCOUNT_C, c, label="team-c")
    obj = wait_ready(env.kube, "Queue", ns, "overridden", timeout=30)
    assert obj["status"]["accountId"] == ACCOUNT_C
    assert names_everywhere(env, f"{ns}-elsewhere") == []
    # spec.account cannot change: a cloud resource does not move between accounts.
    moved = env.kube.kubectl(
        "patch",
        "queue",
        "overridden",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"account": a}}),
        check=False,
    )
    assert moved.returncode != 0 and "spec.account is immutable" in moved.stderr
    env.kube.kubectl("delete", "-n", ns, "queue", "--all")
    for name in ("by-default", "elsewhere", "overridden"):
        wait_gone(env.kube, "Queue", ns, name)


def test_an_unassumable_role_is_reported_within_seconds_and_recovers(env):
    a = f"team-a-{suffix()}"
    ns = namespace(env, a)
    apply_account(env, a, ACCOUNT_A, a)
    apply_in(env, ns, [("Queue", "q", f"{{account: {a}}}")])
    wait_ready(env.kube, "Queue", ns, "q")
    apply_account(env, a, ACCOUNT_A, a, role="no-such-role")
    obj = wait_condition(
        env.kube, "Queue", ns, "q", "Synced", "False", "AccountUnavailable", timeout=30
    )
    message = condition(obj, "Synced")["message"]
    assert "no-such-role" in message and "AccessDenied" in message
    account = wait_for(
        lambda: (c := condition(cloudaccount(env, a), "Ready")) and c["status"] == "False" and c,
        timeout=30,
        what="CloudAccount Ready=False",
    )
    assert account["reason"] == "AccountUnavailable"
    apply_account(env, a, ACCOUNT_A, a)  # fixed
    wait_ready(env.kube, "Queue", ns, "q", timeout=30)
    wait_for(
        lambda: (condition(cloudaccount(env, a), "Ready") or {}).get("status") == "True",
        timeout=30,
        what="CloudAccount Ready again",
    )
    env.kube.kubectl("delete", "-n", ns, "queue", "q")
    wait_gone(env.kube, "Queue", ns, "q")


def test_an_account_in_use_is_deleted_only_after_its_resources(env):
    a = f"team-a-{suffix()}"
    ns = namespace(env, a)
    apply_account(env, a, ACCOUNT_A, a)
    apply_in(env, ns, [("Queue", "q", f"{{account: {a}}}")])
    wait_ready(env.kube, "Queue", ns, "q")
    env.kube.kubectl("delete", "cloudaccount", a, "--wait=false")
    warning = wait_for(
        lambda: events(env.kube, "default", a, "InUse"),
        timeout=30,
        what="an InUse Event on the CloudAccount",
    )
    assert f"{ns}/Queue/q" in warning[0]["message"]
    assert cloudaccount(env, a) is not None
    # New resources may not use an account on its way out.
    apply_in(env, ns, [("Queue", "late", f"{{account: {a}}}")])
    wait_condition(env.kube, "Queue", ns, "late", "Synced", "False", "AccountNotFound")
    env.kube.kubectl("delete", "-n", ns, "queue", "--all")
    wait_gone(env.kube, "Queue", ns, "q")
    wait_for(lambda: cloudaccount(env, a) is None, timeout=60, what="CloudAccount gone")


def test_assume_role_once_per_account_not_per_resource(env):
    names = [f"team-{x}-{suffix()}" for x in "abc"]
    before = env.assume_role_calls()
    spaces = []
    for name, account in zip(names, (ACCOUNT_A, ACCOUNT_B, ACCOUNT_C), strict=True):
        ns = namespace(env, name)
        spaces.append(ns)
        apply_account(env, name, account, name)
        apply_in(env, ns, [("Queue", f"q{i}", f"{{account: {name}}}") for i in range(10)])
    for ns in spaces:
        for i in range(10):
            wait_ready(env.kube, "Queue", ns, f"q{i}", timeout=90)
    calls = env.assume_role_calls() - before
    print(f"AssumeRole calls for 30 queues over 3 accounts, Ready and resynced: {calls}")
    assert calls == 3
    # The operator's own count says the same, per CloudAccount.
    samples = scrape(env.metrics_port)
    for name in names:
        assert (
            sample(samples, "provisioner_assume_role_total", cloudaccount=name, outcome="ok") == 1
        )
    for ns in spaces:
        env.kube.kubectl("delete", "-n", ns, "queue", "--all")


def test_leaks_looks_in_every_account(env, tmp_path):
    """`provisioner leaks` finds a tagged queue whose CR is gone in a CloudAccount's account,
    and writes its findings as metrics for an alert (--metrics-file)."""
    a = f"team-a-{suffix()}"
    namespace(env, a)
    apply_account(env, a, ACCOUNT_B, a, regions=["eu-west-1"])
    orphan = f"orphan-{suffix()}"
    env.as_account(ACCOUNT_B, "sqs", "eu-west-1").create_queue(
        QueueName=orphan,
        tags={
            "provisioner.dev/cluster": "test",
            "provisioner.dev/owner-uid": "00000000-gone",
            "provisioner.dev/namespace": "gone",
            "provisioner.dev/name": orphan,
        },
    )
    # And a spec.access role there that no resource grants any more.
    role = f"gone-app-{suffix()}"
    env.as_account(ACCOUNT_B, "iam", "us-east-1").create_role(
        RoleName=role,
        Path="/provisioner/",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
        Tags=[
            {"Key": "provisioner.dev/cluster", "Value": "test"},
            {"Key": "provisioner.dev/namespace", "Value": "gone"},
            {"Key": "provisioner.dev/service-account", "Value": "app"},
        ],
    )
    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "provisioner",
            "leaks",
            "--cluster-id=test",
            f"--metrics-file={tmp_path / 'leaks.prom'}",
        ],
        env={
            **os.environ,
            **aws_env(env.proxy.url),
            "KUBECONFIG": str(env.kube.stack.kubeconfig),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 1, found.stderr
    (line,) = [line for line in found.stdout.splitlines() if orphan in line]
    assert line.startswith("leaked") and f"in account {ACCOUNT_B}" in line, line
    (line,) = [line for line in found.stdout.splitlines() if role in line]
    assert line.split()[:2] == ["leaked", "IAMRole"], line
    assert "gone/app" in line and f"in account {ACCOUNT_B}" in line, line
    metrics = {
        (s.labels.get("problem"), s.labels.get("kind")): s.value
        for family in text_string_to_metric_families((tmp_path / "leaks.prom").read_text())
        for s in family.samples
        if s.name == "provisioner_leaks"
    }
    assert metrics[("leaked", "Queue")] >= 1 and metrics[("leaked", "IAMRole")] >= 1
    assert metrics[("vanished", "Topic")] == 0  # every kind is there, 0 when clean
    env.as_account(ACCOUNT_B, "iam", "us-east-1").delete_role(RoleName=role)
    env.as_account(ACCOUNT_B, "sqs", "eu-west-1").delete_queue(
        QueueUrl=env.as_account(ACCOUNT_B, "sqs", "eu-west-1").get_queue_url(QueueName=orphan)[
            "QueueUrl"
        ]
    )
    env.kube.kubectl("delete", "cloudaccount", a)


def test_killed_right_after_a_create_then_the_namespace_default_changes(env):
    """SIGKILL right after the cloud's create call returned, before any status of the pass;
    meanwhile the namespace's default account changes. The restarted operator finds the queue
    where it was created (its account was recorded before the call): one queue, in the first
    account, none in the second. A new resource then goes to the new default."""
    a, b = f"team-a-{suffix()}", f"team-b-{suffix()}"
    ns = namespace(env, a, {"cloud.provisioner.dev/default-account": a})
    env.kube.kubectl("label", "namespace", ns, f"team-b={b}")
    apply_account(env, a, ACCOUNT_A, a)
    apply_account(env, b, ACCOUNT_B, b, label="team-b")
    env.operator.stop()
    doomed = env.kube.stack.start_operator(
        endpoint_url=env.proxy.url,
        log=env.kube.dir / f"operator-doomed-{ns}.log",
        args=[f"--resync-seconds={TEST_RESYNC_SECONDS}"],
        cluster_id="test",
        env={"PROVISIONER_CRASHPOINTS": "after-create"},
    )
    try:
        apply_in(env, ns, [("Queue", "q", "{}")])
        wait_for(lambda: doomed.proc.poll() is not None, timeout=60, what="the operator killed")
        assert doomed.proc.returncode == -9
        doomed.proc = None
        assert [u for u in queues_in(env, ACCOUNT_A) if ns in u], "the create call was made"
        env.kube.kubectl(
            "annotate", "namespace", ns, f"cloud.provisioner.dev/default-account={b}", "--overwrite"
        )
    finally:
        env.operator.start()
    obj = wait_ready(env.kube, "Queue", ns, "q", timeout=60)
    assert obj["status"]["accountId"] == ACCOUNT_A and obj["status"]["account"] == a
    assert len([u for u in queues_in(env, ACCOUNT_A) if ns in u]) == 1
    assert [u for u in queues_in(env, ACCOUNT_B) if ns in u] == []
    apply_in(env, ns, [("Queue", "later", "{}")])
    assert wait_ready(env.kube, "Queue", ns, "later")["status"]["accountId"] == ACCOUNT_B
    env.kube.kubectl("delete", "-n", ns, "queue", "--all")
    assert wait_for(lambda: not names_everywhere(env, ns), timeout=60, what="both queues gone")


def test_account_tags_go_under_the_class_s_and_the_resource_s_own(env, request):
    """Cost allocation: a CloudAccount's tags on every resource in it, a ResourceClass's over
    them, the resource's own over both; a class that is in use waits before it goes."""
    team = f"team-t-{suffix()}"
    ns = namespace(env, team)
    body = cloud_account(team, f"arn:aws:iam::{ACCOUNT_A}:role/{ROLE}", {"team": team})
    body["spec"]["tags"] = {"cost-center": "from-account", "billing": "a", "owner": "platform"}
    env.kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    tiers = resource_class(
        team, "Queue", {"team": team}, default=True, tags={"cost-center": "from-class"}
    )

    def remove_class() -> None:
        # Whatever failed, the class goes (a leftover would select nothing).
        env.kube.kubectl("delete", "resourceclass", team, "--wait=false", check=False)
        env.kube.kubectl(
            "patch", "resourceclass", team, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip

    request.addfinalizer(remove_class)
    env.kube.kubectl("apply", "-f", "-", input=tiers)
    spec = {"account": team, "tags": {"owner": "team"}}
    apply_in(env, ns, [("Queue", "q", json.dumps(spec))])
    queue = wait_ready(env.kube, "Queue", ns, "q", timeout=90)
    tags = env.as_account(ACCOUNT_A, "sqs").list_queue_tags(QueueUrl=queue["status"]["queueUrl"])
    assert {k: v for k, v in tags["Tags"].items() if not k.startswith("provisioner.dev/")} == {
        "cost-center": "from-class",
        "billing": "a",
        "owner": "team",
    }
    # The account's tags change: the queue follows.
    env.kube.kubectl(
        "patch", "cloudaccount", team, "--type=merge", "-p", '{"spec":{"tags":{"billing":"b"}}}'
    )
    wait_for(
        lambda: (
            env.as_account(ACCOUNT_A, "sqs")
            .list_queue_tags(QueueUrl=queue["status"]["queueUrl"])["Tags"]
            .get("billing")
            == "b"
        ),
        timeout=60,
        what="the account's new tag on the queue",
    )
    env.kube.kubectl("delete", "resourceclass", team, "--wait=false")
    wait_for(
        lambda: events(env.kube, "default", team, "InUse"),
        timeout=60,
        what="an InUse Event on the ResourceClass",
    )
    env.kube.kubectl("delete", "queue", "q", "-n", ns, "--wait=false")
    wait_for(
        lambda: env.kube.kubectl("get", "resourceclass", team, check=False).returncode != 0,
        timeout=90,
        what="the class to go once its queue is gone",
    )
