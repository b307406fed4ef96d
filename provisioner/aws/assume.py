"""Assumed-role sessions: the credentials the operator acts with in a CloudAccount.

One session per CloudAccount (STS credentials are not regional: the clients of every
region of that account share it), made by AssumeRole with the operator's own identity as
the first hop, cached until shortly before it expires and refreshed ahead of time. A
reconcile never calls STS by itself: about one AssumeRole per account per session lifetime.

A failed AssumeRole is remembered for `failure_hold` seconds: the resources of an account
whose role cannot be assumed make no STS call each, and all see the same message. Editing
the CloudAccount (its role or external id) makes a new key, so the next use tries at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provisioner.aws import errors
from provisioner.model.account import AccountRef

log = logging.getLogger(__name__)

# AssumeRole's default and, for a chained role (IRSA first hop), its maximum: one hour
# (https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRole.html).
SESSION_SECONDS = 3600
# Refreshed when less than this is left (botocore's own advisory window is 15 minutes).
REFRESH_AHEAD = 900.0
# A session whose refresh failed is still used while this much of it is left.
STILL_USABLE = 60.0
FAILURE_HOLD = 15.0


@dataclass(frozen=True)
class Session:
    access_key: str
    secret_key: str
    token: str
    expires: float  # time.time()
    assumed_arn: str


class AssumedSessions:
    """Thread-safe cache of assumed-role credentials, keyed by the whole AccountRef."""

    def __init__(
        self,
        sts: Callable[[], Any],
        session_name: str,
        call: Callable[..., Any],
        *,
        duration: int = SESSION_SECONDS,
        refresh_ahead: float = REFRESH_AHEAD,
        failure_hold: float = FAILURE_HOLD,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sts = sts  # the operator's own STS client (first hop)
        self._call = call
        self.session_name = session_name
        self.duration = duration
        self.refresh_ahead = refresh_ahead
        self.failure_hold = failure_hold
        self.clock = clock
        self._lock = threading.Lock()
        self._key_locks: dict[AccountRef, threading.Lock] = {}
        self._sessions: dict[AccountRef, Session] = {}
        self._failures: dict[AccountRef, tuple[float, errors.AccountUnavailableError]] = {}
        # Told of every AssumeRole call: (CloudAccount name, "ok" or "error"); the metric.
        self.listeners: list[Callable[[str, str], None]] = []

    def session(self, account: AccountRef) -> Session:
        """Credentials for `account`, assuming its role when none are cached or they are
        about to expire; raises AccountUnavailableError."""
        now = self.clock()
        with self._lock:
            current = self._sessions.get(account)
            if current is not None and current.expires - now > self.refresh_ahead:
                return current
            failed = self._failures.get(account)
            if failed is not None and failed[0] > now:
                if current is not None and current.expires - now > STILL_USABLE:
                    return current
                raise failed[1]
            key_lock = self._key_locks.setdefault(account, threading.Lock())
        with key_lock:  # one AssumeRole per account at a time; the others wait for it
            with self._lock:
                current = self._sessions.get(account)
                if current is not None and current.expires - self.clock() > self.refresh_ahead:
                    return current
            try:
                fresh = self._assume(account)
            except errors.AccountUnavailableError as exc:
                with self._lock:
                    self._failures[account] = (self.clock() + self.failure_hold, exc)
                if current is not None and current.expires - self.clock() > STILL_USABLE:
                    log.warning("refreshing the session of %s failed: %s", account.name, exc)
                    return current
                raise
            with self._lock:
                self._sessions[account] = fresh
                self._failures.pop(account, None)
            return fresh

    def _record(self, account: AccountRef, outcome: str) -> None:
        for listener in self.listeners:
            listener(account.name, outcome)

    def _assume(self, account: AccountRef) -> Session:
        kwargs: dict[str, Any] = {
            "RoleArn": account.role_arn,
            "RoleSessionName": self.session_name,
            "DurationSeconds": self.duration,
        }
        if account.external_id:
            kwargs["ExternalId"] = account.external_id
        started = self.clock()
        try:
            answer = self._call(self._sts().assume_role, **kwargs)  # classified by the caller
        except errors.CloudError as exc:
            self._record(account, "error")
            raise errors.AccountUnavailableError(
                f"cannot assume {account.role_arn} for CloudAccount {account.name}: {exc}",
                exc.code or "AssumeRoleFailed",
            ) from None
        self._record(account, "ok")
        creds = answer["Credentials"]
        expiration = creds.get("Expiration")
        expires = expiration.timestamp() if hasattr(expiration, "timestamp") else 0.0
        # A clock that disagrees with STS's (or a cloud that answers a past expiry) must not
        # make every call assume again: never less than the duration asked, from our clock.
        expires = max(expires, started + min(self.duration, 900))
        return Session(
            access_key=creds["AccessKeyId"],
            secret_key=creds["SecretAccessKey"],
            token=creds["SessionToken"],
            expires=expires,
            assumed_arn=str((answer.get("AssumedRoleUser") or {}).get("Arn", "")),
        )

    def forget(self, name: str) -> None:
        """Drop every session and remembered failure of the CloudAccount `name` (edited or
        deleted): the next use assumes its role anew."""
        with self._lock:
            for cache in (self._sessions, self._failures):
                for account in [a for a in cache if a.name == name]:
                    del cache[account]
