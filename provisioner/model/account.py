"""A CloudAccount as the cloud clients need it: where a resource lives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AccountRef:
    """Where a resource lives: a CloudAccount as the cloud clients need it."""

    name: str
    account_id: str
    role_arn: str
    external_id: str = ""
