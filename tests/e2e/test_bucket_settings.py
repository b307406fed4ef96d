"""S3Bucket's encryption with a KMS key, CORS rules and object ownership, through the API server:
refused at apply time when malformed, made in the cloud, served (a browser's CORS preflight),
planned, and put back when changed out of band."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import boto3
import pytest
import yaml

from provisioner_dev.awsenv import aws_env
from tests.conftest import TEST_CLOUD
from tests.helpers import (
    apply,
    assert_refused,
    condition,
    events,
    get,
    merge_patch,
    secret_data,
    try_apply,
    wait_condition,
    wait_for,
    wait_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        TEST_CLOUD != "moto", reason="keys from moto's KMS; moto's answers to CORS preflights"
    ),
]

ORIGIN = "https://app.example.com"
RULE = {
    "allowedOrigins": [ORIGIN],
    "allowedMethods": ["GET", "PUT"],
    "exposeHeaders": ["ETag"],
    "maxAgeSeconds": 600,
}
KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def bucket(name: str, spec: dict[str, Any], version: str = "v1alpha1") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": f"cloud.provisioner.dev/{version}",
            "kind": "S3Bucket",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def kms_key(aws) -> str:
    """A key made by the cloud's KMS in the operator's region: its ARN."""
    env = aws_env(aws.s3.meta.endpoint_url)
    kms = boto3.client(
        "kms",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    return kms.create_key(Description="bucket settings test")["KeyMetadata"]["Arn"]


def encryption_rule(aws, name: str) -> dict[str, Any]:
    answer = aws.s3.get_bucket_encryption(Bucket=name)
    return answer["ServerSideEncryptionConfiguration"]["Rules"][0]


def ownership(aws, name: str) -> str:
    controls = aws.s3.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"]
    return controls["Rules"][0]["ObjectOwnership"]


def cors_rules(aws, name: str) -> list[dict[str, Any]] | None:
    try:
        rules = aws.s3.get_bucket_cors(Bucket=name)["CORSRules"]
    except aws.s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchCORSConfiguration":
            return None
        raise
    return [{k: v for k, v in rule.items() if k != "ID"} for rule in rules]


def preflight(url: str, origin: str, method: str) -> tuple[int, dict[str, str]]:
    """A browser's CORS preflight: OPTIONS with Origin and Access-Control-Request-Method."""
    request = urllib.request.Request(  # noqa: S310 - the cloud's http:// endpoint
        url,
        method="OPTIONS",
        headers={"Origin": origin, "Access-Control-Request-Method": method},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers)


def drifted(kube, namespace: str, name: str, field: str) -> list[dict[str, Any]]:
    return [e for e in events(kube, namespace, name, "Drifted") if field in e["message"]]


# -- refused at apply time, with the field named -------------------------------------------------

REFUSED = [
    pytest.param(
        {"cors": [{"allowedMethods": ["GET"]}]},
        "spec.cors[0].allowedOrigins: Required value",
        id="cors-rule-without-origins",
    ),
    pytest.param(
        {"cors": [{"allowedOrigins": [], "allowedMethods": ["GET"]}]},
        "spec.cors[0].allowedOrigins",
        id="cors-rule-with-empty-origins",
    ),
    pytest.param(
        {"cors": [{"allowedOrigins": ["*"]}]},
        "spec.cors[0].allowedMethods: Required value",
        id="cors-rule-without-methods",
    ),
    pytest.param(
        {"cors": [{"allowedOrigins": ["*"], "allowedMethods": ["GET", "PATCH"]}]},
        'spec.cors[0].allowedMethods[1]: Unsupported value: "PATCH"',
        id="cors-bad-method",
    ),
    pytest.param(
        {"cors": [{"allowedOrigins": ["*"], "allowedMethods": ["GET"], "maxAgeSeconds": -1}]},
        "spec.cors[0].maxAgeSeconds",
        id="cors-negative-max-age",
    ),
    pytest.param(
        {"cors": [{"allowedOrigins": ["*"], "allowedMethods": ["GET"]} for _ in range(101)]},
        "spec.cors: Too many",
        id="cors-over-100-rules",
    ),
    pytest.param(
        {"encryption": "AES256", "kmsKeyId": "alias/app"},
        "spec.kmsKeyId needs spec.encryption: aws:kms",
        id="kms-key-with-aes256",
    ),
    pytest.param(
        {"kmsKeyId": "alias/app"},
        "spec.kmsKeyId needs spec.encryption: aws:kms",
        id="kms-key-with-default-encryption",
    ),
    pytest.param(
        {"encryption": "aws:kms", "kmsKeyId": KEY_ARN, "region": "us-east-1"},
        "spec.kmsKeyId must be a key in spec.region",
        id="kms-key-of-another-region",
    ),
    pytest.param(
        {"encryption": "aws:kms", "kmsKeyId": "not a key"},
        "spec.kmsKeyId",
        id="kms-key-pattern",
    ),
    pytest.param(
        {"objectOwnership": "BucketOwnerOnly"},
        'spec.objectOwnership: Unsupported value: "BucketOwnerOnly"',
        id="ownership-bad-value",
    ),
]


@pytest.mark.parametrize(("spec", "message"), REFUSED)
@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1"])
def test_bad_settings_are_refused_naming_the_field(kube, namespace, version, spec, message):
    assert_refused(try_apply(kube, namespace, bucket("bad", spec, version)), message)
    assert get(kube, "s3bucket", namespace, "bad") is None


ACCEPTED = [
    pytest.param({"encryption": "aws:kms", "kmsKeyId": KEY_ARN, "region": "eu-west-1"}, id="arn"),
    pytest.param({"encryption": "aws:kms", "kmsKeyId": "alias/app/data"}, id="alias"),
    pytest.param(
        {"encryption": "aws:kms", "kmsKeyId": "mrk-1234abcd12ab34cd56ef1234567890ab"}, id="mrk"
    ),
    pytest.param({"cors": []}, id="cors-empty"),
    pytest.param({"cors": [RULE], "objectOwnership": "ObjectWriter"}, id="cors-and-ownership"),
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_good_settings_are_accepted(kube, namespace, spec):
    result = try_apply(kube, namespace, bucket("good", spec), "--dry-run=server")
    assert result.returncode == 0, result.stderr


# -- through the operator ------------------------------------------------------------------------


def test_kms_key_is_used_offered_and_kept(kube, operator, aws, namespace):
    arn = kms_key(aws)
    spec = {
        "encryption": "aws:kms",
        "kmsKeyId": arn,
        "connectionSecret": {"keys": {"BUCKET": "{{ .bucket }}", "KMS_KEY": "{{ .kmsKeyId }}"}},
    }
    apply(kube, namespace, bucket("sealed", spec, "v1beta1"))
    cr = wait_ready(kube, "s3bucket", namespace, "sealed")
    name = cr["status"]["externalName"]
    assert cr["spec"]["bucketKeyEnabled"] is True  # the default
    rule = encryption_rule(aws, name)
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": arn,
    }
    assert rule["BucketKeyEnabled"] is True
    assert secret_data(kube, namespace, "sealed-connection") == {"BUCKET": name, "KMS_KEY": arn}

    # Out of band: the bucket key turned off. The operator puts it back and says so.
    aws.s3.put_bucket_encryption(
        Bucket=name,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {
                        "SSEAlgorithm": "aws:kms",
                        "KMSMasterKeyID": arn,
                    },
                    "BucketKeyEnabled": False,
                }
            ]
        },
    )
    wait_for(
        lambda: drifted(kube, namespace, "sealed", "spec.bucketKeyEnabled"),
        what="the bucket key's drift to be corrected",
    )
    assert encryption_rule(aws, name)["BucketKeyEnabled"] is True


def test_a_key_of_another_region_than_the_operators_is_invalid_spec(kube, operator, aws, namespace):
    # No spec.region, so CEL cannot compare: the operator refuses before creating anything.
    name = f"astray-{namespace}"
    spec = {"bucketName": name, "encryption": "aws:kms", "kmsKeyId": KEY_ARN}
    apply(kube, namespace, bucket("astray", spec))
    cr = wait_condition(kube, "s3bucket", namespace, "astray", "Synced", "False", "InvalidSpec")
    message = condition(cr, "Synced")["message"]
    assert "spec.kmsKeyId" in message and "eu-west-1" in message and "us-east-1" in message
    assert not any(b["Name"] == name for b in aws.s3.list_buckets()["Buckets"])


def test_cors_rules_serve_preflights_and_are_put_back(kube, operator, aws, namespace):
    apply(kube, namespace, bucket("web", {"cors": [RULE]}))
    cr = wait_ready(kube, "s3bucket", namespace, "web")
    name = cr["status"]["externalName"]
    expected = [
        {
            "AllowedOrigins": [ORIGIN],
            "AllowedMethods": ["GET", "PUT"],
            "ExposeHeaders": ["ETag"],
            "MaxAgeSeconds": 600,
        }
    ]
    assert cors_rules(aws, name) == expected
    # No objectOwnership: a new bucket is BucketOwnerEnforced.
    assert ownership(aws, name) == "BucketOwnerEnforced"

    # A browser's preflight against the endpoint the Secret gives.
    endpoint = secret_data(kube, namespace, "web-connection")["endpoint"]
    status, headers = preflight(f"{endpoint}/{name}/upload.bin", ORIGIN, "PUT")
    assert status == 200, headers
    assert headers["Access-Control-Allow-Origin"] == ORIGIN
    assert headers["Access-Control-Allow-Methods"] == "GET, PUT"
    assert headers["Access-Control-Expose-Headers"] == "ETag"
    assert headers["Access-Control-Max-Age"] == "600"
    status, _ = preflight(f"{endpoint}/{name}/upload.bin", "https://elsewhere.example.com", "PUT")
    assert status == 403

    # Deleted out of band: put back, with a Drifted Event naming the field.
    aws.s3.delete_bucket_cors(Bucket=name)
    wait_for(lambda: cors_rules(aws, name) == expected, what="the CORS rules to be put back")
    wait_for(lambda: drifted(kube, namespace, "web", "spec.cors"), what="a Drifted Event")
    status, headers = preflight(f"{endpoint}/{name}/upload.bin", ORIGIN, "GET")
    assert status == 200 and headers["Access-Control-Allow-Methods"] == "GET, PUT"

    # An empty list: no rules.
    merge_patch(kube, "s3bucket", namespace, "web", '{"spec":{"cors":[]}}')
    wait_ready(kube, "s3bucket", namespace, "web", generation=2)
    assert cors_rules(aws, name) is None


def test_object_ownership_is_planned_applied_and_put_back(kube, operator, aws, namespace):
    apply(kube, namespace, bucket("owned", {"objectOwnership": "BucketOwnerPreferred"}))
    cr = wait_ready(kube, "s3bucket", namespace, "owned")
    name = cr["status"]["externalName"]
    assert ownership(aws, name) == "BucketOwnerPreferred"

    aws.s3.put_bucket_ownership_controls(
        Bucket=name, OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]}
    )
    wait_for(
        lambda: ownership(aws, name) == "BucketOwnerPreferred",
        what="the object ownership to be put back",
    )
    wait_for(
        lambda: drifted(kube, namespace, "owned", "spec.objectOwnership"), what="a Drifted Event"
    )

    # Planned: the plan names the field with both values, and nothing changes.
    plan_only = "cloud.provisioner.dev/plan-only"
    kube.kubectl("annotate", "s3bucket", "owned", "-n", namespace, f"{plan_only}=true")
    merge_patch(kube, "s3bucket", namespace, "owned", '{"spec":{"objectOwnership":"ObjectWriter"}}')
    cr = wait_for(
        lambda: (
            (o := get(kube, "s3bucket", namespace, "owned"))
            and (o["status"].get("plan") or {}).get("generation") == 2
            and o
        ),
        what="the plan of the edit",
    )
    assert cr["status"]["plan"]["action"] == "Update"
    assert cr["status"]["plan"]["changes"] == [
        {"field": "spec.objectOwnership", "cloud": "BucketOwnerPreferred", "spec": "ObjectWriter"}
    ]
    assert ownership(aws, name) == "BucketOwnerPreferred"
    kube.kubectl("annotate", "s3bucket", "owned", "-n", namespace, f"{plan_only}-")
    wait_ready(kube, "s3bucket", namespace, "owned", generation=2)
    assert ownership(aws, name) == "ObjectWriter"
