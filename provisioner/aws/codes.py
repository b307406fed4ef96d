"""The error codes every AWS service shares, by what they mean to the operator.

Each kind adds its own service's codes (`ErrorCodes` in provisioner/aws/errors.py, given in
its KindDescriptor). provisioner/aws/session.py classifies every failure with these and
the kinds' codes; provisioner/aws/budget.py shrinks a call budget on SLOW_DOWN only.

The sources: botocore's retry checkers (botocore/retries/standard.py,
`ThrottledRetryableChecker._THROTTLED_ERROR_CODES` and
`TransientRetryableChecker._TRANSIENT_ERROR_CODES`), the AWS SDKs' retry behaviour
(https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html: "transient
errors" and "throttling errors" are retried), and the common errors of the services' API
references (e.g. https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/CommonErrors.html,
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).
"""

from __future__ import annotations

# "Slow down": the account calls the service faster than it allows. Each of these says the
# request rate is exceeded and nothing else; all are in botocore's throttled list
# (PriorRequestNotComplete, Route 53's "a prior request is still being processed", in its
# transient list too).
TOO_MANY_CALLS = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "PriorRequestNotComplete",
    }
)

# S3's own "slow down" (503 SlowDown, "Please reduce your request rate", S3's error
# responses above; in botocore's throttled list). The S3 kind retries it
# (provisioner/kinds/s3.py).
S3_SLOW_DOWN = "SlowDown"

# What the call budget takes for a throttle of the bucket a call spent its token from:
# the call rate is too high (5xx answers and name holds are not).
SLOW_DOWN = TOO_MANY_CALLS | {S3_SLOW_DOWN}

# The rest of botocore's throttled list: a limit other than the account's call rate is
# reached (a table's provisioned throughput, a transaction still in progress, bandwidth, a
# service's quota, EC2's own throttle). Retried; no call budget is blamed.
OTHER_LIMIT_REACHED = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "EC2ThrottledException",
    }
)

# "Try again": the service failed or timed out this once. RequestTimeout and
# RequestTimeoutException are botocore's transient codes; InternalFailure (500) and
# ServiceUnavailable (503) are the common errors of every Query API; InternalError (500) is
# S3's; ServiceFailure (500) is IAM's ("the request processing has failed because of an
# unknown error, exception or failure").
TRANSIENT = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "ServiceFailure",
    }
)

# Retried with backoff whatever the service (a kind adds its own, `ErrorCodes.retryable`);
# any 5xx or 429 answer is retried too (provisioner/aws/session.py).
TRY_AGAIN = TOO_MANY_CALLS | OTHER_LIMIT_REACHED | TRANSIENT

# The request's credentials were rejected or are missing (the common errors
# InvalidClientTokenId, IncompleteSignature, MissingAuthenticationToken; S3's
# InvalidAccessKeyId, SignatureDoesNotMatch and ExpiredToken; the JSON services'
# UnrecognizedClientException; EC2's AuthFailure): a platform problem, not the spec's.
CREDENTIALS_REJECTED = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "ExpiredToken",
        "ExpiredTokenException",
        "AuthFailure",
        "MissingAuthenticationToken",
        "IncompleteSignature",
    }
)

# The resource is not there, whatever the service (a kind adds its own words for it).
NOT_FOUND = frozenset({"404", "NotFound"})

# The name is taken: no code says so for every service (each kind has its own).
CONFLICT: frozenset[str] = frozenset()

# The endpoint does not offer the API at all (an emulator without the service; HTTP 501).
NOT_OFFERED = frozenset({"InternalFailure.NotImplemented", "NotImplemented", "NotImplementedError"})
