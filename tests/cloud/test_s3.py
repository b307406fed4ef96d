"""S3Client against moto's server."""

from __future__ import annotations

from collections import Counter
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
        "spec.kmsKeyId": None,
        "spec.bucketKeyEnabled": None,
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


# -- encryption with a KMS key, CORS, object ownership ----------------------------------------

CORS = [
    {
        "allowedOrigins": ["https://app.example.com"],
        "allowedMethods": ["GET", "PUT"],
        "allowedHeaders": ["*"],
        "exposeHeaders": ["ETag"],
        "maxAgeSeconds": 300,
    },
    {"allowedOrigins": ["*"], "allowedMethods": ["HEAD"]},
]


@pytest.fixture
def kms_key(moto_url):
    """A key made by moto's KMS: (its ARN, its key id)."""

    def make(region="us-east-1"):
        kms = boto3.session.Session().client("kms", region_name=region, endpoint_url=moto_url)
        meta = kms.create_key(Description="bucket test key")["KeyMetadata"]
        return meta["Arn"], meta["KeyId"]

    return make


def _calls():
    """The operator's AWS calls so far, by operation (whatever their outcome)."""
    calls: Counter[str] = Counter()
    for (_, operation, _), n in CALLS.counts.items():
        calls[operation] += n
    return calls


def _encryption_rule(raw, bucket):
    answer = raw.get_bucket_encryption(Bucket=bucket)
    return answer["ServerSideEncryptionConfiguration"]["Rules"][0]


def _fields(diffs):
    return {d.field: (d.observed, d.desired) for d in diffs}


def test_a_default_bucket_costs_what_it_did_and_is_bucket_owner_enforced(s3, raw_s3, make_resource):
    res = make_resource("S3Bucket")
    before = _calls()
    obs = s3.create(res, {})
    made = _calls() - before
    # us-east-1: the ownership check (GetBucketTagging) besides the writes.
    assert made == Counter(
        {
            "CreateBucket": 1,
            "GetBucketTagging": 1,
            "PutBucketTagging": 1,
            "PutPublicAccessBlock": 1,
            "PutBucketEncryption": 1,
        }
    )
    assert obs.diffs == [] and "kmsKeyId" not in obs.connection
    controls = raw_s3().get_bucket_ownership_controls(Bucket=res.external_name)
    assert controls["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]

    # Unmanaged CORS and ownership are not read on a look, and not drift when they change.
    raw_s3().put_bucket_cors(
        Bucket=res.external_name,
        CORSConfiguration={"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}]},
    )
    raw_s3().put_bucket_ownership_controls(
        Bucket=res.external_name,
        OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]},
    )
    before = _calls()
    assert s3.observe(res).diffs == []
    looked = _calls() - before
    assert "GetBucketCors" not in looked and "GetBucketOwnershipControls" not in looked
    assert looked["GetBucketEncryption"] == 1 and sum(looked.values()) == 6


def test_kms_key_and_bucket_key_are_written_read_and_corrected(s3, raw_s3, make_resource, kms_key):
    arn, key_id = kms_key()
    other_arn, _ = kms_key()
    res = make_resource("S3Bucket", {"encryption": "aws:kms", "kmsKeyId": arn})
    s3.create(res, {})
    raw = raw_s3()
    rule = _encryption_rule(raw, res.external_name)
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": arn,
    }
    assert rule["BucketKeyEnabled"] is True
    obs = s3.observe(res)
    assert obs.diffs == []
    assert obs.connection["kmsKeyId"] == arn
    assert obs.client_state["config"]["spec.kmsKeyId"] == arn

    # The same key named by its id: no diff (the cloud answers with the ARN).
    by_id = make_resource("S3Bucket", {"encryption": "aws:kms", "kmsKeyId": key_id})
    by_id = replace(by_id, external_name=res.external_name, uid=res.uid)
    assert s3.observe(by_id).diffs == []

    # Out of band: another key, no bucket key. Both are diffs, and one write corrects both.
    raw.put_bucket_encryption(
        Bucket=res.external_name,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {
                        "SSEAlgorithm": "aws:kms",
                        "KMSMasterKeyID": other_arn,
                    },
                    "BucketKeyEnabled": False,
                }
            ]
        },
    )
    obs = s3.observe(res)
    assert _fields(obs.diffs) == {
        "spec.kmsKeyId": (other_arn, arn),
        "spec.bucketKeyEnabled": (False, True),
    }
    before = _calls()
    s3.update(res, obs, obs.diffs)
    assert (_calls() - before) == Counter({"PutBucketEncryption": 1})
    rule = _encryption_rule(raw, res.external_name)
    assert rule["ApplyServerSideEncryptionByDefault"]["KMSMasterKeyID"] == arn
    assert rule["BucketKeyEnabled"] is True
    assert s3.observe(res).diffs == []

    # Only the bucket key written (say under drift-policy report): the cloud's key stays.
    raw.put_bucket_encryption(
        Bucket=res.external_name,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {
                        "SSEAlgorithm": "aws:kms",
                        "KMSMasterKeyID": other_arn,
                    },
                    "BucketKeyEnabled": False,
                }
            ]
        },
    )
    obs = s3.observe(res)
    s3.update(res, obs, [d for d in obs.diffs if d.field == "spec.bucketKeyEnabled"])
    rule = _encryption_rule(raw, res.external_name)
    assert rule["ApplyServerSideEncryptionByDefault"]["KMSMasterKeyID"] == other_arn
    assert rule["BucketKeyEnabled"] is True

    # Back to AES256: the key goes with the algorithm.
    plain = replace(res, spec=replace(res.spec, encryption="AES256"))
    obs = s3.observe(plain)
    assert _fields(obs.diffs) == {
        "spec.encryption": ("aws:kms", "AES256"),
        "spec.kmsKeyId": (other_arn, None),
    }
    s3.update(plain, obs, obs.diffs)
    rule = _encryption_rule(raw, res.external_name)
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert s3.observe(plain).diffs == []
    assert "kmsKeyId" not in s3.observe(plain).connection


def test_a_key_of_another_region_is_refused_before_any_write(s3, make_resource, kms_key):
    arn, _ = kms_key("eu-west-1")
    res = make_resource("S3Bucket", {"encryption": "aws:kms", "kmsKeyId": arn})
    before = CALLS.total()
    with pytest.raises(errors.TerminalError, match=r"spec\.kmsKeyId") as refused:
        s3.create(res, {})
    assert refused.value.reason == "InvalidSpec" and "eu-west-1" in str(refused.value)
    assert CALLS.total() == before
    assert s3.observe(res).exists is False


def test_cors_rules_are_written_read_and_corrected(s3, raw_s3, make_resource):
    res = make_resource("S3Bucket", {"cors": CORS})
    s3.create(res, {})
    raw = raw_s3()
    rules = raw.get_bucket_cors(Bucket=res.external_name)["CORSRules"]
    assert [{k: v for k, v in r.items() if k != "ID"} for r in rules] == [
        {
            "AllowedOrigins": ["https://app.example.com"],
            "AllowedMethods": ["GET", "PUT"],
            "AllowedHeaders": ["*"],
            "ExposeHeaders": ["ETag"],
            "MaxAgeSeconds": 300,
        },
        {"AllowedOrigins": ["*"], "AllowedMethods": ["HEAD"]},
    ]
    obs = s3.observe(res)
    assert obs.diffs == [] and obs.client_state["config"]["spec.cors"] == CORS

    # Deleted out of band: a diff from no rules to the spec's, and put back.
    raw.delete_bucket_cors(Bucket=res.external_name)
    obs = s3.observe(res)
    assert _fields(obs.diffs) == {"spec.cors": ([], CORS)}
    s3.update(res, obs, obs.diffs)
    assert len(raw.get_bucket_cors(Bucket=res.external_name)["CORSRules"]) == 2
    assert s3.observe(res).diffs == []

    # An empty list is managed too: "no rules", so the rules are deleted.
    none = replace(res, spec=replace(res.spec, settings=replace(res.spec.settings, cors=())))
    obs = s3.observe(none)
    assert _fields(obs.diffs) == {"spec.cors": (CORS, [])}
    s3.update(none, obs, obs.diffs)
    with pytest.raises(raw.exceptions.ClientError, match="NoSuchCORSConfiguration"):
        raw.get_bucket_cors(Bucket=res.external_name)
    assert s3.observe(none).diffs == []


def test_object_ownership_is_created_read_and_corrected(s3, raw_s3, make_resource):
    res = make_resource("S3Bucket", {"objectOwnership": "ObjectWriter"}, region="eu-west-1")
    s3.create(res, {})
    raw = raw_s3("eu-west-1")

    def ownership():
        controls = raw.get_bucket_ownership_controls(Bucket=res.external_name)
        return controls["OwnershipControls"]["Rules"][0]["ObjectOwnership"]

    assert ownership() == "ObjectWriter"
    assert s3.observe(res).diffs == []
    raw.put_bucket_ownership_controls(
        Bucket=res.external_name,
        OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerPreferred"}]},
    )
    obs = s3.observe(res)
    assert _fields(obs.diffs) == {"spec.objectOwnership": ("BucketOwnerPreferred", "ObjectWriter")}
    s3.update(res, obs, obs.diffs)
    assert ownership() == "ObjectWriter"
    # Removed out of band: none is a diff as well.
    raw.delete_bucket_ownership_controls(Bucket=res.external_name)
    obs = s3.observe(res)
    assert _fields(obs.diffs) == {"spec.objectOwnership": (None, "ObjectWriter")}
    s3.update(res, obs, obs.diffs)
    assert ownership() == "ObjectWriter"
    # A second create (a crash after CreateBucket) puts the spec's settings on what is there.
    raw.put_bucket_ownership_controls(
        Bucket=res.external_name,
        OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
    )
    s3.create(res, {})
    assert ownership() == "ObjectWriter"
    s3.delete(res, s3.observe(res))
