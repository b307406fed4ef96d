"""botocore's data files, pruned to what the operator uses, and the sessions that read them.

botocore parses its endpoint table (`endpoints.json`: every service in every region, 1.25 MB
of JSON, about 6.7 MB as Python objects) with the first client, and each client's service
model whole (S3's: 116 operations, 1.4 MB of JSON, most of it documentation). The operator
ships pruned copies in DATA_DIR, written by provisioner_dev/botocore_data.py from the pinned
botocore's own files (tests/unit/test_botocore_data.py fails when they differ from what it
would write):

- `endpoints.json`: every partition and region, but only the services in SERVICES;
- `<service>/<version>/service-2.json` for S3, EC2, EKS, IAM and RDS: the operations in
  OPERATIONS and the shapes they use (every exception shape too), with every `documentation`
  emptied. A client's model is read whole and kept while the client lives: EC2's (830
  operations, of which the operator calls two) is 16 MB as Python objects, IAM's 4.9 MB,
  RDS's 4.2 MB;
- `<service>/<version>/service-2.json` for each other service of SERVICES (small ones): the
  model with every operation, every `documentation` emptied.

`session()` makes a boto3 session whose data loader looks in DATA_DIR first, then where
botocore would (AWS_DATA_PATH, ~/.aws/models, botocore's own data): any other file or
service comes from botocore as before. The pruned files count as botocore's own data: a
client without an endpoint URL resolves its endpoint with the service's rule set exactly as
with the full table (botocore hands the rule set the table's answer as a custom endpoint
when the table is not its own).
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import botocore.loaders
import botocore.session

DATA_DIR = Path(__file__).with_name("botocore_data")

# The AWS services the operator makes clients for (botocore's names).
SERVICES = ("ec2", "eks", "iam", "rds", "resourcegroupstaggingapi", "s3", "sns", "sqs", "sts")

# The S3 operations the operator calls, and those botocore itself calls on an S3 client
# (HeadBucket: the region redirector; CreateSession: S3 Express directory buckets).
S3_OPERATIONS = (
    "CreateBucket",
    "CreateSession",
    "DeleteBucket",
    "DeleteBucketCors",
    "DeleteBucketLifecycle",
    "DeleteObjects",
    "DeletePublicAccessBlock",
    "GetBucketCors",
    "GetBucketEncryption",
    "GetBucketLifecycleConfiguration",
    "GetBucketNotificationConfiguration",
    "GetBucketOwnershipControls",
    "GetBucketTagging",
    "GetBucketVersioning",
    "GetPublicAccessBlock",
    "HeadBucket",
    "ListBuckets",
    "ListObjectVersions",
    "PutBucketCors",
    "PutBucketEncryption",
    "PutBucketLifecycleConfiguration",
    "PutBucketNotificationConfiguration",
    "PutBucketOwnershipControls",
    "PutBucketTagging",
    "PutBucketVersioning",
    "PutPublicAccessBlock",
)


# The EC2 operations the operator calls (a database's subnets and security groups).
EC2_OPERATIONS = ("DescribeSecurityGroups", "DescribeSubnets")

# The EKS operations of spec.access's Pod Identity associations.
EKS_OPERATIONS = (
    "CreatePodIdentityAssociation",
    "DeletePodIdentityAssociation",
    "DescribePodIdentityAssociation",
    "ListPodIdentityAssociations",
    "ListTagsForResource",
    "TagResource",
    "UntagResource",
)

# The IAM operations of spec.access's roles and the IRSA issuer's check.
IAM_OPERATIONS = (
    "CreateRole",
    "DeleteRole",
    "DeleteRolePolicy",
    "GetOpenIDConnectProvider",
    "GetRole",
    "GetRolePolicy",
    "ListRolePolicies",
    "ListRoles",
    "PutRolePolicy",
    "UpdateAssumeRolePolicy",
)

# The RDS operations of DatabaseInstance (instances, replicas, restores, subnet and parameter
# groups, tags).
RDS_OPERATIONS = (
    "AddTagsToResource",
    "CreateDBInstance",
    "CreateDBInstanceReadReplica",
    "CreateDBParameterGroup",
    "CreateDBSubnetGroup",
    "DeleteDBInstance",
    "DeleteDBParameterGroup",
    "DeleteDBSubnetGroup",
    "DescribeDBEngineVersions",
    "DescribeDBInstances",
    "DescribeDBParameterGroups",
    "DescribeDBParameters",
    "DescribeDBSnapshots",
    "DescribeDBSubnetGroups",
    "ListTagsForResource",
    "ModifyDBInstance",
    "ModifyDBParameterGroup",
    "PromoteReadReplica",
    "RebootDBInstance",
    "RemoveTagsFromResource",
    "ResetDBParameterGroup",
    "RestoreDBInstanceFromDBSnapshot",
    "RestoreDBInstanceToPointInTime",
)

# The services whose model is pruned to the operations the operator calls; the others (small
# ones) keep every operation: botocore's credential providers call STS operations of their own.
OPERATIONS: dict[str, tuple[str, ...]] = {
    "ec2": EC2_OPERATIONS,
    "eks": EKS_OPERATIONS,
    "iam": IAM_OPERATIONS,
    "rds": RDS_OPERATIONS,
    "s3": S3_OPERATIONS,
}


class Loader(botocore.loaders.Loader):  # type: ignore[misc]  # botocore is untyped
    """botocore's loader with DATA_DIR first; its files count as botocore's own."""

    def __init__(self, data_path: str | None = None) -> None:
        # `data_path`: AWS_DATA_PATH or the config file's, as botocore's create_loader reads it.
        extra = [
            os.path.expanduser(os.path.expandvars(p))
            for p in (data_path or "").split(os.pathsep)
            if p
        ]
        super().__init__(extra_search_paths=[str(DATA_DIR), *extra])

    def is_builtin_path(self, path: str) -> bool:
        return Path(path).is_relative_to(DATA_DIR) or bool(super().is_builtin_path(path))


def session() -> boto3.session.Session:
    """A boto3 session that reads the pruned data first."""
    core = botocore.session.Session()
    core.register_component("data_loader", Loader(core.get_config_variable("data_path")))
    return boto3.session.Session(botocore_session=core)


def check() -> None:
    """Raise unless a session reads every pruned file from DATA_DIR (installed with the
    package) and makes a client of every service in SERVICES (the image's build runs it)."""
    loader = Loader()
    names = sorted(p.relative_to(DATA_DIR).with_suffix("") for p in DATA_DIR.rglob("*.json"))
    if Path("endpoints") not in names:
        raise RuntimeError(f"{DATA_DIR / 'endpoints.json'} is missing")
    for name in names:
        _, path = loader.load_data_with_path(str(name))
        if not Path(path).is_relative_to(DATA_DIR):
            raise RuntimeError(f"{name} was read from {path}, not from {DATA_DIR}")
    aws = session()
    for service in SERVICES:
        aws.client(service, region_name="us-east-1")
