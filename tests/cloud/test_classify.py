"""aws.classify on synthetic botocore errors, and Aws.call's retries (no server needed)."""

from __future__ import annotations

import botocore.exceptions
import pytest

from provisioner.aws import errors
from provisioner.aws.session import AwsSettings, classify
from provisioner.kinds.registry import ERROR_CODES, make_aws


def client_error(
    code: str, http: int = 400, message: str = "boom"
) -> botocore.exceptions.ClientError:
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": http},
    }
    return botocore.exceptions.ClientError(response, "SomeOperation")


@pytest.mark.parametrize(
    ("exc", "expected", "code"),
    [
        (client_error("Throttling"), errors.RetryableError, "Throttling"),
        (client_error("ThrottlingException"), errors.RetryableError, "ThrottlingException"),
        (client_error("SlowDown", 503), errors.RetryableError, "SlowDown"),
        (client_error("Whatever", 503), errors.RetryableError, "Whatever"),
        (client_error("AccessDenied", 403), errors.TerminalError, "AccessDenied"),
        (
            client_error("InvalidClientTokenId", 403),
            errors.CredentialsError,
            "InvalidClientTokenId",
        ),
        (client_error("NoSuchBucket", 404), errors.NotFoundError, "NoSuchBucket"),
        (client_error("DBInstanceNotFound", 404), errors.NotFoundError, "DBInstanceNotFound"),
        (client_error("BucketAlreadyExists", 409), errors.ConflictError, "BucketAlreadyExists"),
        (client_error("InvalidParameterValue"), errors.TerminalError, "InvalidParameterValue"),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
            errors.RetryableError,
            "EndpointConnectionError",
        ),
        (botocore.exceptions.NoCredentialsError(), errors.CredentialsError, "NoCredentials"),
    ],
)
def test_classify(exc, expected, code):
    classified = classify(exc, ERROR_CODES)
    assert type(classified) is expected
    assert classified.code == code


def test_classify_keeps_the_clouds_message():
    assert (
        classify(client_error("AccessDenied", 403, "not allowed"), ERROR_CODES).message
        == "not allowed"
    )


def test_call_retries_throttling_then_succeeds():
    aws = make_aws(AwsSettings(region="us-east-1", max_wait=0.01))
    attempts = []

    def flaky(value):
        attempts.append(value)
        if len(attempts) < 3:
            raise client_error("Throttling")
        return value

    assert aws.call(flaky, "ok") == "ok"
    assert attempts == ["ok", "ok", "ok"]


def test_call_does_not_retry_terminal_errors():
    aws = make_aws(AwsSettings(region="us-east-1", max_wait=0.01))
    attempts = []

    def refused():
        attempts.append(1)
        raise client_error("InvalidParameterValue")

    with pytest.raises(errors.TerminalError):
        aws.call(refused)
    assert len(attempts) == 1


def test_call_gives_up_after_the_configured_attempts():
    aws = make_aws(AwsSettings(region="us-east-1", attempts=3, max_wait=0.01))
    attempts = []

    def throttled():
        attempts.append(1)
        raise client_error("Throttling")

    with pytest.raises(errors.RetryableError):
        aws.call(throttled)
    assert len(attempts) == 3
