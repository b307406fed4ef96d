"""spec.access's documents and names: the action table, the trust policies, IAM's limits."""

from __future__ import annotations

import re

import pytest

from provisioner.access import iam
from provisioner.access.iam import AccessSettings
from provisioner.kinds.registry import KINDS

GRANTING = [k for k in KINDS if k.access_actions]
# The kinds whose grants are on the resource itself (a DatabaseInstance's are on its master
# user secret: tests/unit/test_rds_password.py).
OWN = [k for k in GRANTING if k.kind != "DatabaseInstance"]
# AWS's access level "Read" or "List" (Service Authorization Reference): what `read` may hold.
READ_VERBS = re.compile(r"^[a-z0-9]+:(Get|List|Receive)")
# Deleting the resource itself, or changing what the spec or the operator owns.
NEVER = re.compile(
    r":(DeleteBucket$|DeleteQueue$|DeleteTopic$|PutBucketPolicy|DeleteBucketPolicy|"
    r"PutBucketTagging|TagQueue|UntagQueue|TagResource|UntagResource|SetQueueAttributes|"
    r"SetTopicAttributes|PutBucketVersioning|PutLifecycleConfiguration|PutEncryption|"
    r"PutBucketPublicAccessBlock|AddPermission|RemovePermission|CreateBucket|CreateQueue)"
)


def test_the_kinds_that_grant_access():
    assert sorted(k.kind for k in GRANTING) == ["DatabaseInstance", "Queue", "S3Bucket", "Topic"]


@pytest.mark.parametrize("kind", OWN, ids=lambda k: k.kind)
def test_each_level_holds_the_one_below_and_read_never_writes(kind):
    read, write, admin = (set(kind.access_actions[level]) for level in iam.LEVELS)
    assert read < write < admin
    assert all(READ_VERBS.match(a) for a in read), sorted(read)
    assert not [a for a in admin if NEVER.search(a)]
    assert all(a.startswith(f"{kind.service}:") for a in admin)


def test_a_bucket_policy_names_the_bucket_and_its_objects_only():
    s3 = next(k for k in GRANTING if k.kind == "S3Bucket")
    doc = iam.permission_policy(s3, "read", ["arn:aws:s3:::team-a-data-1234"])
    (statement,) = doc["Statement"]
    assert statement["Resource"] == [
        "arn:aws:s3:::team-a-data-1234",
        "arn:aws:s3:::team-a-data-1234/*",
    ]
    assert statement["Effect"] == "Allow"
    assert "s3:GetObject" in statement["Action"] and "s3:PutObject" not in statement["Action"]


def test_a_queue_or_topic_policy_names_its_arn_only():
    for kind in (k for k in OWN if k.kind != "S3Bucket"):
        arn = f"arn:aws:{kind.service}:us-east-1:123456789012:q"
        (statement,) = iam.permission_policy(kind, "admin", [arn])["Statement"]
        assert statement["Resource"] == [arn]


def test_irsa_trust_is_the_service_account_of_this_issuer_only():
    settings = AccessSettings(
        "irsa", oidc_issuer="https://oidc.eks.eu-west-1.amazonaws.com/id/AB12/"
    )
    doc = iam.trust_policy(settings, "aws", "111111111111", "team-a", "web")
    (statement,) = doc["Statement"]
    issuer = "oidc.eks.eu-west-1.amazonaws.com/id/AB12"
    assert statement["Principal"] == {
        "Federated": f"arn:aws:iam::111111111111:oidc-provider/{issuer}"
    }
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Condition"] == {
        "StringEquals": {
            f"{issuer}:sub": "system:serviceaccount:team-a:web",
            f"{issuer}:aud": "sts.amazonaws.com",
        }
    }


def test_pod_identity_trust_is_the_service_account_of_this_cluster_only():
    doc = iam.trust_policy(
        AccessSettings("pod-identity", eks_cluster="prod"), "aws", "1", "ns", "sa"
    )
    (statement,) = doc["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert statement["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": "prod",
        "aws:RequestTag/kubernetes-namespace": "ns",
        "aws:RequestTag/kubernetes-service-account": "sa",
    }


def test_role_names_fit_iam_and_never_meet_across_clusters():
    long_ns, long_sa = "n" * 63, "s" * 253
    name = iam.role_name("prod", long_ns, long_sa)
    assert len(name) <= 64 and re.fullmatch(r"[\w+=,.@-]+", name)
    assert name == iam.role_name("prod", long_ns, long_sa)
    assert name != iam.role_name("staging", long_ns, long_sa)
    assert iam.role_name("prod", "a-b", "c") != iam.role_name("prod", "a", "b-c")
    policy = iam.policy_name("S3Bucket", "x" * 253, "uid-1")
    assert len(policy) <= 128 and policy != iam.policy_name("S3Bucket", "x" * 253, "uid-2")


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (AccessSettings("off"), ""),
        (AccessSettings("irsa"), "--oidc-issuer"),
        (AccessSettings("pod-identity"), "--eks-cluster"),
        (AccessSettings("everyone"), "must be off"),
        (AccessSettings("irsa", oidc_issuer="https://x/id/1"), ""),
    ],
)
def test_settings_say_what_is_missing(settings, needle):
    problem = settings.problem()
    assert (needle in problem) if needle else problem == ""
