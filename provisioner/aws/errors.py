"""Every cloud failure, classified once.

The reconciler maps these classes to conditions and backoff; no per-kind
try/except ladders. Messages are the cloud's own words (which never carry our
secret values) and are safe to show in conditions and Events.
"""

from __future__ import annotations

from dataclasses import dataclass


class CloudError(Exception):
    """Base class. `code` is the cloud's error code, `message` its text."""

    reason = "ReconcileError"

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message


class RetryableError(CloudError):
    """Throttling, 5xx, timeouts, dropped connections: retried with backoff."""


class CredentialsError(CloudError):
    """Missing or rejected AWS credentials: a platform problem, retried slowly."""


class TerminalError(CloudError):
    """The cloud refused the spec: no retry until the spec changes."""

    reason = "InvalidSpec"


class NotFoundError(CloudError):
    """The resource does not exist."""


class ConflictError(CloudError):
    """The name is taken by something that is not ours."""

    reason = "NameConflict"


class DeletionBlocked(CloudError):
    """The cloud refuses to delete for a reason the user must fix (objects in a bucket)."""


class NameHeldError(CloudError):
    """The cloud holds the name for a while after a resource of that name was deleted
    (SQS QueueDeletedRecently for 60 s, S3 OperationAborted): creating waits, no error."""


class RetryLaterError(CloudError):
    """The cloud refuses the change for now for a documented reason (an RDS storage change
    within 6 hours of the previous one): retried after `retry_after` seconds, not sooner."""

    def __init__(self, message: str, code: str = "", retry_after: float = 600.0) -> None:
        super().__init__(message, code)
        self.retry_after = retry_after


class AccountUnavailableError(CloudError):
    """AssumeRole into the resource's CloudAccount failed (its message): nothing is called in
    that account; retried with backoff, and at once when the CloudAccount changes."""

    reason = "AccountUnavailable"


class NotSupportedError(TerminalError):
    """The endpoint does not offer this service at all (e.g. RDS on LocalStack's free edition)."""


@dataclass(frozen=True)
class ErrorCodes:
    """A service's own error codes, beyond the ones every AWS service shares."""

    not_found: frozenset[str] = frozenset()
    conflict: frozenset[str] = frozenset()
    retryable: frozenset[str] = frozenset()
    # The name is held after a recent deletion: creating waits until the cloud lets it go.
    name_held: frozenset[str] = frozenset()
