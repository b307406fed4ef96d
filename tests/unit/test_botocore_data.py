"""The pruned botocore data the operator ships (provisioner/aws/botodata.py).

provisioner/aws/botocore_data/ is written by provisioner_dev/botocore_data.py from the pinned
botocore; these tests fail when a file differs from what it would write, when the operator makes
a client of a service (or calls an S3 operation) the pruned files leave out, when a session of
the operator's resolves an endpoint or signs for another region than one with botocore's full
files would, and when the image would keep other services' models than the operator's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore import xform_name

from provisioner.aws import botodata
from provisioner.aws.session import Aws, AwsSettings
from provisioner.kinds import registry as kinds
from provisioner.kinds import tagging
from provisioner_dev import botocore_data

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "provisioner").rglob("*.py"))
# One region of each partition the operator is documented to run in, and a second one of aws.
REGIONS = {
    "us-east-1": "aws",
    "eu-west-1": "aws",
    "cn-north-1": "aws-cn",
    "us-gov-west-1": "aws-us-gov",
}
# One call per service, made up to the point where it would be sent.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ec2": ("describe_subnets", {}),
    "eks": ("list_pod_identity_associations", {"clusterName": "c"}),
    "iam": ("list_roles", {}),
    "rds": ("describe_db_instances", {}),
    "resourcegroupstaggingapi": ("get_resources", {}),
    "s3": ("head_bucket", {"Bucket": "provisioner-test-bucket"}),
    "sns": ("list_topics", {}),
    "sqs": ("list_queues", {}),
    "sts": ("get_caller_identity", {}),
}


def pruned() -> dict[str, Any]:
    return dict(json.loads((botodata.DATA_DIR / "endpoints.json").read_text()))


def full_session() -> boto3.session.Session:
    core = botocore.session.Session()
    core.register_component("data_loader", botocore_data.builtin_loader())
    return boto3.session.Session(botocore_session=core)


def test_the_files_are_what_the_generator_writes_from_the_pinned_botocore():
    assert botocore_data.stale() == [], "run: python -m provisioner_dev.botocore_data"
    assert botocore_data.main(["--check"]) == 0


def test_a_session_reads_the_pruned_files_and_makes_every_client():
    botodata.check()


def test_every_service_the_operator_makes_a_client_for_is_kept():
    text = "\n".join(p.read_text() for p in SOURCES)
    named = set(re.findall(r"\bclient\(\s*\"([a-z0-9-]+)\"", text))
    named |= {k.service for k in kinds.KINDS} | {tagging.SERVICE}
    assert named <= set(botodata.SERVICES), "add them to botodata.SERVICES, run the generator"
    assert set(CALLS) == set(botodata.SERVICES)
    loader = botocore_data.builtin_loader()
    for partition in pruned()["partitions"]:
        if partition["partition"] in REGIONS.values():
            for service in botodata.SERVICES:
                prefix = botocore_data.endpoint_prefix(loader, service)
                assert prefix in partition["services"], (service, partition["partition"])


# Per pruned service: operations its scan finds that are the names of something else (the
# operator's own functions), and a few it must find (the scan itself is checked).
NOT_CALLED = {
    # rds_parameters.create_group and list_groups; IamClient.get_policy and delete_policy
    # (GetRolePolicy and DeleteRolePolicy underneath).
    "iam": {"CreateGroup", "ListGroups", "GetPolicy", "DeletePolicy"},
}
SURELY_CALLED = {
    "ec2": {"DescribeSubnets", "DescribeSecurityGroups"},
    "eks": {"CreatePodIdentityAssociation"},
    "iam": {"CreateRole", "PutRolePolicy"},
    "rds": {"CreateDBInstance", "RestoreDBInstanceToPointInTime", "DescribeDBParameters"},
    "s3": {"CreateBucket", "PutBucketTagging", "ListObjectVersions"},
}
# The exceptions botocore raises by name stay.
EXCEPTIONS = {
    "ec2": set(),
    "eks": {"ResourceNotFoundException"},
    "iam": {"NoSuchEntityException", "EntityAlreadyExistsException"},
    "rds": {"DBInstanceNotFoundFault", "DBInstanceAlreadyExistsFault"},
    "s3": {"NoSuchBucket", "BucketAlreadyOwnedByYou"},
}


def test_the_pruned_services_are_named_with_what_they_must_keep():
    assert set(botodata.OPERATIONS) == set(SURELY_CALLED) == set(EXCEPTIONS)
    assert set(botodata.OPERATIONS) <= set(botodata.SERVICES)


@pytest.mark.parametrize("service", sorted(botodata.OPERATIONS))
def test_every_operation_the_operator_calls_is_kept(service):
    """Any operation whose method name is a word of the operator's sources is in the pruned
    model, and the pruned model has only the operations listed. (AWS's spelling is no clue:
    spec.access's policies name actions such as s3:GetObject.)"""
    full = botocore.session.Session().get_service_model(service)
    called = set()
    for path in SOURCES:
        words = set(re.findall(r"\b[a-z][a-z0-9_]*\b", path.read_text()))
        called |= {op for op in full.operation_names if xform_name(op) in words}
    called -= NOT_CALLED.get(service, set())
    assert SURELY_CALLED[service] <= called
    model = botodata.session().client(service, region_name="us-east-1").meta.service_model
    assert called <= set(model.operation_names), f"add them to botodata.OPERATIONS[{service!r}]"
    assert set(botodata.OPERATIONS[service]) == set(model.operation_names)
    assert EXCEPTIONS[service] <= {s.name for s in model.error_shapes}


@pytest.mark.parametrize("service", sorted(set(botodata.SERVICES) - set(botodata.OPERATIONS)))
def test_the_other_services_keep_every_operation_without_documentation(service):
    full = botocore.session.Session().get_service_model(service)
    model = botodata.session().client(service, region_name="us-east-1").meta.service_model
    assert set(model.operation_names) == set(full.operation_names)
    some = model.operation_model(model.operation_names[0])
    assert some.documentation == "" != full.operation_model(some.name).documentation


def test_a_client_of_every_service_is_light():
    """Every client the operator can make, together, above what the first one costs: a few MB
    (botocore's full models: EC2's alone is 16 MB as Python objects)."""
    session = botodata.session()
    first = session.client("sts", region_name="us-east-1")
    models = [
        session.client(s, region_name="us-east-1").meta.service_model for s in botodata.SERVICES
    ]
    text = sum(len(json.dumps(m._service_description)) for m in models)
    assert first and text < 1_500_000, f"{text:,} bytes of models"


class Sent(Exception):
    def __init__(self, request: Any) -> None:
        self.url = str(request.url)
        auth = request.headers.get("Authorization", b"")
        scope = re.search(r"Credential=[^/]+/\d+/([^/]+)/([^/]+)/", auth.decode())
        self.scope = scope.groups() if scope else None


def sent(client: Any, operation: str, params: dict[str, Any]) -> tuple[str, Any]:
    def stop(request: Any, **_: Any) -> None:
        raise Sent(request)

    client.meta.events.register("before-send", stop)
    with pytest.raises(Sent) as caught:
        getattr(client, operation)(**params)
    return caught.value.url, caught.value.scope


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_clients_resolve_and_sign_as_with_botocores_full_files(region, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    aws = Aws(AwsSettings(region=region))
    full = full_session()
    assert aws.partition(region) == REGIONS[region] == full.get_partition_for_region(region)
    for service, (operation, params) in CALLS.items():
        ours = aws.client(service, region)
        theirs = full.client(service, config=aws._config(region))
        assert ours.meta.endpoint_url == theirs.meta.endpoint_url, service
        url, scope = sent(ours, operation, params)
        assert (url, scope) == sent(theirs, operation, params), service
        assert scope is not None and scope[1] in {service, "s3", "tagging"}, (service, scope)
        assert REGIONS[region] == "aws-cn" or ".amazonaws.com" in url


def test_the_pruned_table_is_much_smaller_and_keeps_every_partition():
    full = botocore_data.builtin_loader().load_data("endpoints")
    assert [p["partition"] for p in pruned()["partitions"]] == [
        p["partition"] for p in full["partitions"]
    ]
    for ours, theirs in zip(pruned()["partitions"], full["partitions"], strict=True):
        assert {k: v for k, v in ours.items() if k != "services"} == {
            k: v for k, v in theirs.items() if k != "services"
        }
    assert (botodata.DATA_DIR / "endpoints.json").stat().st_size < 150_000


def test_the_image_keeps_the_models_of_the_operators_services():
    args = re.search(r'^ARG AWS_SERVICES="([^"]*)"', (ROOT / "Dockerfile").read_text(), re.M)
    assert args is not None
    assert sorted(args.group(1).split()) == sorted(botodata.SERVICES)
