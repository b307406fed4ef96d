"""provisioner.aws.session.classify: no secret values in messages; right classes for S3 409s."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from provisioner.aws import errors
from provisioner.aws.budget import CallBudget
from provisioner.aws.session import Aws, AwsSettings, classify
from provisioner.kinds import registry as kinds
from provisioner.kinds.registry import ERROR_CODES
from provisioner.kinds.s3 import S3Client
from provisioner.model.resource import Resource

SECRET = "s3cr3tP4ss"


def client_error(code: str, http: int, message: str = "boom") -> botocore.exceptions.ClientError:
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": http},
    }
    return botocore.exceptions.ClientError(response, "SomeOperation")


# -- ParamValidationError: names kept, values dropped ----------------------------------


def test_param_validation_hides_the_value_but_names_the_parameter():
    exc = botocore.exceptions.ParamValidationError(
        report=(
            f"Invalid type for parameter MasterUserPassword, value: {SECRET}, "
            "type: <class 'int'>, valid types: <class 'str'>"
        )
    )
    classified = classify(exc, ERROR_CODES)
    assert type(classified) is errors.TerminalError
    assert classified.code == "ParamValidation"
    for text in (str(classified), classified.message, *map(str, classified.args)):
        assert SECRET not in text
    assert "MasterUserPassword" in str(classified)
    assert "valid types" in str(classified)


def test_param_validation_multi_line_report_hides_every_value():
    report = "\n".join(
        [
            f"Invalid type for parameter MasterUserPassword, value: {SECRET}, "
            "type: <class 'int'>, valid types: <class 'str'>",
            f"Invalid length for parameter MasterUsername, value: {SECRET}2, valid min length: 1",
            f"Invalid value for parameter Port, value: {SECRET}3, valid min value: 1150",
            'Unknown parameter in input: "Bogus", must be one of: DBInstanceIdentifier',
        ]
    )
    classified = classify(botocore.exceptions.ParamValidationError(report=report), ERROR_CODES)
    text = str(classified)
    assert SECRET not in text
    for name in ("MasterUserPassword", "MasterUsername", "Port", "Bogus"):
        assert name in text


def test_param_validation_from_botocores_own_validator():
    """The report botocore really produces for a password of the wrong type."""
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    model = get_session().get_service_model("rds")
    shape = model.operation_model("ModifyDBInstance").input_shape
    report = ParamValidator().validate(
        {"DBInstanceIdentifier": "db", "MasterUserPassword": 31337424242}, shape
    )
    assert report.has_errors()
    raw = report.generate_report()
    assert "31337424242" in raw  # botocore does quote it
    classified = classify(botocore.exceptions.ParamValidationError(report=raw), ERROR_CODES)
    assert "31337424242" not in str(classified)
    assert "MasterUserPassword" in str(classified)


# -- S3 409s ------------------------------------------------------------------------


def test_bucket_not_empty_409_is_not_a_name_conflict():
    classified = classify(
        client_error("BucketNotEmpty", 409, "The bucket is not empty"), ERROR_CODES
    )
    assert not isinstance(classified, errors.ConflictError)
    assert isinstance(classified, errors.CloudError)
    assert classified.code == "BucketNotEmpty"


def test_bucket_already_exists_409_is_a_name_conflict():
    classified = classify(client_error("BucketAlreadyExists", 409), ERROR_CODES)
    assert isinstance(classified, errors.ConflictError)


# -- how S3Client consumes those classes (real classify, fake boto3 client) ------------


class FakeS3:
    """Every S3 operation answers {} unless `failures` names it."""

    def __init__(self, failures: dict[str, Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def __getattr__(self, operation: str) -> Any:
        def call(**kwargs: Any) -> dict[str, Any]:
            self.calls.append(operation)
            if operation in self.failures:
                raise self.failures[operation]
            return {}

        call.__name__ = operation
        return call


class FakeAws:
    """Aws.call (real retry and classify) around a fake client; no boto3 session."""

    call = Aws.call

    def __init__(self, s3: FakeS3) -> None:
        self.settings = AwsSettings(region="eu-west-1", attempts=1, max_wait=0.0)
        self.codes = ERROR_CODES
        self.budget = CallBudget(self.settings.budget)
        self.s3 = s3

    def client(self, service: str, region: str | None = None, account: Any = None) -> Any:
        return self.s3

    def partition(self, region: str) -> str:
        return "aws"


def bucket() -> Resource:
    body = {
        "kind": "S3Bucket",
        "metadata": {"namespace": "ns", "name": "b", "uid": "uid-1"},
        "spec": {"bucketName": "my-bucket"},
    }
    return kinds.parse(body, region="eu-west-1", cluster_id="c")


def test_s3_delete_race_with_new_objects_is_retryable():
    s3 = FakeS3({"delete_bucket": client_error("BucketNotEmpty", 409, "not empty")})
    with pytest.raises(errors.RetryableError):
        S3Client(FakeAws(s3)).delete(bucket(), observation=None)


def test_s3_create_tolerates_bucket_already_owned_by_you():
    s3 = FakeS3({"create_bucket": client_error("BucketAlreadyOwnedByYou", 409, "yours")})
    S3Client(FakeAws(s3)).create(bucket(), {})
    assert "put_bucket_tagging" in s3.calls


# -- an answer botocore cannot parse -----------------------------------------------------


HTML_500 = (
    b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
    b"<h1>Internal Server Error</h1>\n"
)


def test_an_error_page_instead_of_an_aws_answer_is_retried_inside_the_call():
    from botocore.parsers import ResponseParserError

    unparsable = ResponseParserError(
        f"Unable to parse response, invalid XML received: {HTML_500!r}"
    )
    classified = classify(unparsable, ERROR_CODES)
    assert type(classified) is errors.RetryableError
    assert classified.code == "ResponseParserError"
    assert "<html" not in str(classified)

    answers: list[Any] = [unparsable, {"DBInstances": []}]

    def describe() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    aws = Aws(AwsSettings(region="us-east-1", max_wait=0.05), ERROR_CODES)
    assert aws.call(describe) == {"DBInstances": []}
    assert answers == []
