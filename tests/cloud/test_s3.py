"""S3Client against moto's server."""

from __future__ import annotations

from dataclasses import replace

import boto3
import pytest

from provisioner.aws import errors
from provisioner.aws.session import CALLS
from provisioner.kinds import s3 as s3_module
from provisioner.kinds.contract import PasswordClient
from provisioner.kinds.s3 import S3Client

pytestmark = pytest.mark.cloud

CONNECTION_KEYS = {"bucket", "region", "arn", "endpoint"}


@pytest.fixture
def s3(aws):
    return S3Client(aws)


@pytest.fixture
def raw_s3(aws, moto_url):
    """A client of botocore's full S3 model, for what the test does beside the operator (the
    operator's own clients know only its operations: provisioner/aws/botodata.py)."""

    def client(region="us-east-1"):
        return boto3.session.Session().client("s3", region_name=region, endpoint_url=moto_url)

    return client


def _raw_tags(aws, bucket, region="us-east-1"):
    tag_set = aws.client("s3", region).get_bucket_tagging(Bucket=bucket)["TagSet"]
    return {tag["Key"]: tag["Value"] for tag in tag_set}


def _exists(aws, bucket):
    try:
        aws.client("s3").head_bucket(Bucket=bucket)
    except aws.client("s3").exceptions.ClientError:
        return False
    return True


def test_lifecycle(aws, s3, make_resource):
    res = make_resource("S3Bucket", tags={"team": "a"})
    name = res.external_name
    assert s3.observe(res).exists is False

    s3.create(res, {})
    obs = s3.observe(res)
    assert obs.exists and obs.owned_by(res) and obs.available and not obs.deleting
    assert obs.diffs == []
    assert _raw_tags(aws, name) == res.desired_tags
    assert obs.connection == {
        "bucket": name,
        "region": "us-east-1",
        "arn": f"arn:aws:s3:::{name}",
        "endpoint": aws.settings.endpoint_url,
    }
    assert set(obs.connection) == CONNECTION_KEYS and obs.arn == f"arn:aws:s3:::{name}"
    assert obs.status == {}
    assert obs.client_state["config"] == {
        "spec.versioning": False,
        "spec.encryption": "AES256",
        "spec.blockPublicAccess": True,
        "spec.lifecycle.expireAfterDays": None,
    }

    before = CALLS.total()
    s3.update(res, obs, obs.diffs)  # up to date: no call at all
    assert CALLS.total() == before

    changed = replace(
        res,
        spec=replace(
            res.spec,
            versioning=True,
            encryption="aws:kms",
            block_public_access=False,
            expire_after_days=7,
        ),
        user_tags={"team": "b"},
    )
    obs = s3.observe(changed)
    assert {d.field for d in obs.diffs} == {
        "spec.versioning",
        "spec.encryption",
        "spec.blockPublicAccess",
        "spec.lifecycle.expireAfterDays",
        "tags",
    }
    s3.update(changed, obs, obs.diffs)
    assert s3.observe(changed).diffs == []
    assert _raw_tags(aws, name) == changed.desired_tags

    # Back: versioning suspended, lifecycle removed, public access blocked again.
    obs = s3.observe(res)
    assert len(obs.diffs) == 5
    s3.update(res, obs, obs.diffs)
    assert s3.observe(res).diffs == []
    versioning = aws.client("s3").get_bucket_versioning(Bucket=name)
    assert versioning["Status"] == "Suspended"

    assert not isinstance(s3, PasswordClient)  # no password capability

    s3.delete(res, obs)
    assert s3.observe(res).exists is False
    s3.delete(res, obs)  # already gone: success


def test_other_region_and_repeated_create(aws, s3, raw_s3, make_resource):
    res = make_resource("S3Bucket", {"versioning": True}, region="eu-west-1")
    s3.create(res, {})
    s3.create(res, {})  # BucketAlreadyOwnedByYou: ours already, configure and carry on
    obs = s3.observe(res)
    assert obs.owned_by(res) and obs.diffs == []
    assert obs.connection["region"] == "eu-west-1"
    location = raw_s3("eu-west-1").get_bucket_location(Bucket=res.external_name)
    assert location["LocationConstraint"] == "eu-west-1"
    s3.delete(res, obs)
    assert s3.observe(res).exists is False


def test_foreign_bucket_is_observed_not_owned(aws, s3, make_resource):
    res = make_resource("S3Bucket")
    raw = aws.client("s3")
    raw.create_bucket(Bucket=res.external_name)
    obs = s3.observe(res)
    assert obs.exists and obs.owner_uid == "" and not obs.owned_by(res)

    # Tagged by someone else: create must not take it over.
    raw.put_bucket_tagging(
        Bucket=res.external_name,
        Tagging={"TagSet": [{"Key": "provisioner.dev/owner-uid", "Value": "someone-else"}]},
    )
    assert s3.observe(res).owner_uid == "someone-else"
    with pytest.raises(errors.ConflictError):
        s3.create(res, {})
    assert _raw_tags(aws, res.external_name) == {"provisioner.dev/owner-uid": "someone-else"}


def test_delete_with_objects_is_blocked_without_force_destroy(aws, s3, raw_s3, make_resource):
    res = make_resource("S3Bucket")
    s3.create(res, {})
    raw_s3().put_object(Bucket=res.external_name, Key="keep.txt", Body=b"data")
    with pytest.raises(errors.DeletionBlocked, match="forceDestroy"):
        s3.delete(res, s3.observe(res))
    assert _exists(aws, res.external_name)
    assert s3.observe(res).exists


def test_force_destroy_empties_every_version(aws, s3, raw_s3, make_resource, monkeypatch):
    # Small pages and batches, so that pagination and batching are exercised too.
    monkeypatch.setattr(s3_module, "PAGE_SIZE", 2)
    res = make_resource("S3Bucket", {"versioning": True, "forceDestroy": True})
    s3.create(res, {})
    raw = raw_s3()
    for key in ("a", "b"):
        for body in (b"1", b"2", b"3"):
            raw.put_object(Bucket=res.external_name, Key=key, Body=body)
    raw.delete_object(Bucket=res.external_name, Key="a")  # a delete marker
    listing = raw.list_object_versions(Bucket=res.external_name)
    assert len(listing["Versions"]) == 6 and len(listing["DeleteMarkers"]) == 1

    s3.delete(res, s3.observe(res))
    assert not _exists(aws, res.external_name)
    assert s3.observe(res).exists is False
