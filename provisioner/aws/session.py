"""boto3 clients, retries with jittered backoff, and error classification.

Clients are made once per (service, region, account) and shared across threads (boto3
clients are thread-safe; sessions are not, hence the lock). The regions are those the
operator knows (provisioner/placement/accounts.py refuses any other spec.region before a client is
asked for), and at most CLIENT_CACHE_SIZE clients are kept, the least recently used going
first. A resource that lives in a CloudAccount gets clients signed with that account's
assumed-role session (provisioner/aws/assume.py); the others, the operator's own
credentials. botocore's own retry loop is off: tenacity retries retryable errors inside one
call, and the reconciler requeues with a growing delay after that.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import botocore.config
import botocore.exceptions
import tenacity
from botocore.parsers import ResponseParserError

from provisioner import tracing
from provisioner.aws import botodata, errors
from provisioner.aws.assume import AssumedSessions
from provisioner.aws.budget import BudgetSettings, CallBudget
from provisioner.aws.codes import CONFLICT, CREDENTIALS_REJECTED, NOT_FOUND, NOT_OFFERED, TRY_AGAIN
from provisioner.aws.errors import ErrorCodes
from provisioner.model.account import AccountRef

T = TypeVar("T")
log = logging.getLogger(__name__)
# How long a failed GetCallerIdentity stands before the operator's own account is asked again.
OWN_ACCOUNT_RETRY = 30.0
# The clients kept at most (about 220 KiB each; making one again takes about 10 ms): the
# services of every kind, with IAM and STS, in some 35 (region, account) pairs.
CLIENT_CACHE_SIZE = 256


def merge_codes(codes: list[ErrorCodes]) -> ErrorCodes:
    """The codes every AWS service shares (provisioner/aws/codes.py) plus every kind's own
    (KindDescriptor.error_codes)."""
    return ErrorCodes(
        not_found=NOT_FOUND.union(*(c.not_found for c in codes)),
        conflict=CONFLICT.union(*(c.conflict for c in codes)),
        retryable=TRY_AGAIN.union(*(c.retryable for c in codes)),
        name_held=frozenset().union(*(c.name_held for c in codes)),
    )


SHARED_CODES = merge_codes([])


def classify(exc: BaseException, codes: ErrorCodes = SHARED_CODES) -> errors.CloudError:
    """Turn any boto/botocore exception into one of our classes."""
    if isinstance(exc, errors.CloudError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        return _classify_answer(exc, codes)
    if isinstance(
        exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
    ):
        return errors.CredentialsError(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, "
            "or an IRSA role for the operator",
            "NoCredentials",
        )
    if isinstance(
        exc,
        botocore.exceptions.EndpointConnectionError
        | botocore.exceptions.ConnectionError
        | botocore.exceptions.ReadTimeoutError
        | botocore.exceptions.ConnectTimeoutError
        | botocore.exceptions.ResponseStreamingError
        | botocore.exceptions.IncompleteReadError
        | ConnectionError
        | TimeoutError,
    ):
        return errors.RetryableError(str(exc), type(exc).__name__)
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        # botocore quotes the offending values, which may be a password: keep only the names.
        report = str(exc.kwargs.get("report", ""))
        return errors.TerminalError(
            "invalid request: " + re.sub(r", value: .*?(?=, type:|$)", "", report, flags=re.M),
            "ParamValidation",
        )
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return errors.RetryableError(str(exc), type(exc).__name__)
    if isinstance(exc, ResponseParserError):
        # An answer that is no AWS response at all, e.g. an HTML "500 Internal Server Error"
        # page from a server that failed part-way: retried like any other 5xx.
        return errors.RetryableError(
            "the cloud answered with something that is not an AWS response (an error page)",
            "ResponseParserError",
        )
    raise exc


def _classify_answer(exc: botocore.exceptions.ClientError, codes: ErrorCodes) -> errors.CloudError:
    """The class of an error the cloud answered with, by its code and HTTP status."""
    err = exc.response.get("Error", {})
    code = str(err.get("Code", "")) or "Unknown"
    message = str(err.get("Message", "")) or code
    http = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    if code in NOT_OFFERED or (http == 501):
        operation = getattr(exc, "operation_name", "") or "this API"
        return errors.NotSupportedError(
            f"the cloud endpoint does not offer {operation}: {message}", code
        )
    if code in codes.not_found or (http == 404 and code not in codes.conflict):
        return errors.NotFoundError(message, code)
    if code in codes.name_held:
        return errors.NameHeldError(message, code)
    if code in CREDENTIALS_REJECTED:
        return errors.CredentialsError(f"AWS credentials were rejected: {message}", code)
    if code in codes.retryable or http >= 500 or http == 429:
        return errors.RetryableError(message, code)
    if code in codes.conflict:
        return errors.ConflictError(message, code)
    return errors.TerminalError(message, code)


@dataclass(frozen=True)
class AwsSettings:
    region: str
    endpoint_url: str | None = None
    # Attempts inside one call for retryable errors, before the reconciler requeues.
    attempts: int = 4
    max_wait: float = 4.0
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    # The client-side call budget (provisioner/aws/budget.py).
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    # RoleSessionName of the operator's assumed-role sessions (CloudTrail shows it).
    session_name: str = "provisioner"


class CallCounter:
    """Counts AWS calls by (service, operation, outcome); thread-safe. Listeners also get
    the account a call acted in ("" for the operator's own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.listeners: list[Callable[[str, str, str, str], None]] = []

    def record(self, service: str, operation: str, outcome: str, account: str = "") -> None:
        with self._lock:
            self.counts[(service, operation, outcome)] += 1
        for listener in self.listeners:
            listener(service, operation, outcome, account)

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


CALLS = CallCounter()


class Aws:
    """Shared boto3 clients for one operator process."""

    def __init__(self, settings: AwsSettings, codes: ErrorCodes = SHARED_CODES) -> None:
        self.settings = settings
        self.codes = codes
        # botocore's endpoint table and S3's model, pruned (provisioner/aws/botodata.py).
        self._session = botodata.session()
        self._lock = threading.Lock()
        # (service, region, account name, access key of its session) -> client, the least
        # recently used first.
        self._clients: OrderedDict[tuple[str, str, str, str], Any] = OrderedDict()
        self.budget = CallBudget(settings.budget)
        self.sessions = AssumedSessions(
            lambda: self.client("sts"), settings.session_name, self.call
        )
        self._own_account: str | None = None
        self._own_account_failure: tuple[float, errors.CloudError] | None = None
        self._own_account_lock = threading.Lock()

    def _config(self, region: str) -> botocore.config.Config:
        return botocore.config.Config(
            region_name=region,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=self.settings.connect_timeout,
            read_timeout=self.settings.read_timeout,
            max_pool_connections=32,
            s3={"addressing_style": "path"},
        )

    def client(
        self, service: str, region: str | None = None, account: AccountRef | None = None
    ) -> Any:
        """The shared client of `service` in `region`, acting in `account` (None: with the
        operator's own credentials). Raises AccountUnavailableError when the account's role
        cannot be assumed."""
        region = region or self.settings.region
        session = self.sessions.session(account) if account is not None else None
        key = (
            service,
            region,
            account.name if account else "",
            session.access_key if session else "",
        )
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
            credentials: dict[str, str] = {}
            if session is not None:
                credentials = {
                    "aws_access_key_id": session.access_key,
                    "aws_secret_access_key": session.secret_key,
                    "aws_session_token": session.token,
                }
                # The clients of the account's previous session go: they would sign with
                # credentials about to expire.
                for old in [k for k in self._clients if k[:3] == key[:3]]:
                    del self._clients[old]
            client = self._session.client(
                service,
                endpoint_url=self.settings.endpoint_url,
                config=self._config(region),
                **credentials,
            )
            account_id = account.account_id if account else ""
            client._provisioner_account = account_id  # the call budget's key
            client.meta.events.register(
                "after-call", functools.partial(_count_call, account=account_id)
            )
            client.meta.events.register(
                "after-call-error", functools.partial(_count_call_error, account=account_id)
            )
            self._clients[key] = client
            while len(self._clients) > CLIENT_CACHE_SIZE:
                self._clients.popitem(last=False)
            return client

    def account_id(self, account: AccountRef | None = None) -> str:
        """The account a client acts in: the CloudAccount's, or the operator's own (asked
        of STS once per process: the first caller asks, under a lock, and those that come
        meanwhile wait for its answer). Raises the CloudError of STS's answer when it does
        not say; that answer stands for OWN_ACCOUNT_RETRY seconds, so that an endpoint
        without STS is not asked at every pass."""
        if account is not None:
            return account.account_id
        if self._own_account is not None:
            return self._own_account
        with self._own_account_lock:
            return self._ask_own_account(hold_failure=True)

    def ask_own_account_in_background(self) -> threading.Thread:
        """Ask for the operator's own account on a thread of its own, at start: the first
        resources then find the answer there. A failure here is not held (an endpoint still
        starting); the first resource that needs the account asks again."""

        def ask() -> None:
            with self._own_account_lock:
                try:
                    self._ask_own_account(hold_failure=False)
                except errors.CloudError as exc:
                    log.debug("the operator's own account is not known yet: %s", exc)

        thread = threading.Thread(target=ask, name="own-account", daemon=True)
        thread.start()
        return thread

    def _ask_own_account(self, *, hold_failure: bool) -> str:
        """GetCallerIdentity, unless answered or failed within OWN_ACCOUNT_RETRY seconds;
        the caller holds `_own_account_lock`."""
        if self._own_account is not None:
            return self._own_account
        failed = self._own_account_failure
        if failed is not None and time.monotonic() < failed[0]:
            raise failed[1].with_traceback(None)
        try:
            sts = self.client("sts")
            own = str(self.call(sts.get_caller_identity)["Account"])
        except errors.CloudError as exc:
            if hold_failure:
                self._own_account_failure = (time.monotonic() + OWN_ACCOUNT_RETRY, exc)
            raise
        self._own_account = own
        self._own_account_failure = None
        return own

    def partition(self, region: str) -> str:
        """The ARN partition of a region ("aws", "aws-cn", "aws-us-gov")."""
        return str(self._session.get_partition_for_region(region))

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call `fn`, retrying retryable errors with jittered exponential backoff.

        Raises a classified `CloudError`.
        """
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(errors.RetryableError),
            wait=tenacity.wait_random_exponential(multiplier=0.25, max=self.settings.max_wait),
            stop=tenacity.stop_after_attempt(self.settings.attempts),
            reraise=True,
        )
        account = str(getattr(getattr(fn, "__self__", None), "_provisioner_account", "") or "")
        with tracing.aws_call(account):
            for attempt in retrying:
                with attempt:
                    try:
                        return self.budget.run(fn, *args, **kwargs)
                    except errors.CloudError as exc:
                        tracing.attempt_failed(exc.code)
                        raise
                    except Exception as exc:  # noqa: BLE001 - classified right here
                        classified = classify(exc, self.codes)
                        tracing.attempt_failed(classified.code)
                        raise classified from None
        raise AssertionError("unreachable")


def _count_call(http_response: Any, parsed: Any, model: Any, account: str = "", **_: Any) -> None:
    status = int(getattr(http_response, "status_code", 0) or 0)
    outcome = "ok" if status < 400 else f"http_{status}"
    CALLS.record(model.service_model.service_name, model.name, outcome, account)


def _count_call_error(event_name: str = "", account: str = "", **_: Any) -> None:
    _event, service, operation = ([*event_name.split(".", 2), "", ""])[:3]
    CALLS.record(service, operation, "connection_error", account)
