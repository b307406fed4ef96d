"""The CloudAccount controller.

- CloudAccounts, Namespaces -> watched into the account directory; a change rechecks the
                              resources it affects
- with `manages_accounts`    -> Ready from an AssumeRole (at each change and every 30 s), and
                              a finalizer held while resources use the CloudAccount
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf

from provisioner import ACCOUNTS_API_VERSION, ACCOUNTS_VERSION, GROUP
from provisioner.aws import errors
from provisioner.aws.session import Aws
from provisioner.config import Settings
from provisioner.kube.client import Kube
from provisioner.kube.inventory import custom_resources
from provisioner.model import conditions as cond
from provisioner.placement import accounts
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Event
from provisioner.runtime.kopf_setup import plain
from provisioner.runtime.resync import ResyncScheduler

log = logging.getLogger(__name__)

# kopf's ids of the handlers, as its log lines name them.
ACCOUNT_WATCH, NAMESPACE_WATCH = "cloudaccount-watch", "namespace-watch"
RELEASE = "release"
CHECK = "cloudaccounts-check"


def account_directory(kube: Kube) -> accounts.Directory:
    return accounts.Directory(
        lambda name: kube.request("GET", f"/apis/{ACCOUNTS_API_VERSION}/{accounts.PLURAL}/{name}"),
        lambda name: kube.request("GET", f"/api/v1/namespaces/{name}"),
    )


def account_users(kube: Kube, name: str) -> list[str]:
    """The resources that live in the CloudAccount `name`, or name it and wait to be
    created there: "namespace/Kind/name", sorted."""
    users = []
    for item in custom_resources(kube):
        status, spec = item.get("status") or {}, item.get("spec") or {}
        lives = status.get("account") == name
        waits = "account" not in status and spec.get("account") == name
        if lives or waits:
            meta = item["metadata"]
            users.append(f"{meta['namespace']}/{item['kind']}/{meta['name']}")
    return sorted(users)


@dataclass(frozen=True)
class AccountsController:
    """The handlers of CloudAccounts and namespaces. `manage`: this replica keeps the
    CloudAccounts' status and finalizer (it has `aws` to assume their roles with)."""

    reconciler: Reconciler
    directory: accounts.Directory
    scheduler: ResyncScheduler
    aws: Aws | None
    manage: bool

    async def assess(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The status patch saying whether AssumeRole works ({} when nothing changed)."""
        assert self.aws is not None
        account = accounts.CloudAccount.from_body(raw)
        try:
            session = await self.reconciler.in_thread(self.aws.sessions.session, account.ref)
        except errors.AccountUnavailableError as exc:
            ready = cond.Condition(cond.READY, False, cond.ACCOUNT_UNAVAILABLE, str(exc))
            fields: dict[str, Any] = {}
        else:
            ready = cond.Condition(
                cond.READY, True, "RoleAssumed", f"assumed {session.assumed_arn}"
            )
            fields = {"assumedArn": session.assumed_arn}
        return cond.status_patch(raw.get("status") or {}, [ready], account.generation, fields)

    async def check(self, raw: dict[str, Any]) -> None:
        """Ready when AssumeRole works, with the identity it gave: at each change (from the
        watch, so that a spec edited back to the last one handled is checked too) and every
        30 s (a session is cached: that costs an AssumeRole only when a failure is retried)."""
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            return
        name = raw["metadata"]["name"]
        try:
            if update := await self.assess(raw):
                await self.reconciler.in_thread(
                    self.reconciler.kube.request,
                    "PATCH",
                    f"/apis/{ACCOUNTS_API_VERSION}/{accounts.PLURAL}/{name}/status",
                    {"status": update},
                    content_type="application/merge-patch+json",
                )
        except Exception as exc:  # noqa: BLE001 - the 30-second check tries again
            log.warning("checking CloudAccount %s failed: %s", name, exc)

    async def on_account_event(self, type: str | None, body: Any, **_: Any) -> None:
        name = str(body["metadata"]["name"])
        if type == "DELETED":
            self.directory.account_gone(name)
            changed = True
        else:
            raw = plain(body)
            before, now = self.directory.account_seen(raw)
            changed = before != now
            if before is not None and before.ref != now.ref and self.aws is not None:
                self.aws.sessions.forget(name)  # its role changed: assume the new one
            if changed and self.manage:
                await self.check(raw)
        if changed:
            affected = self.reconciler.affected(account=name)
            if affected:
                log.info("CloudAccount %s changed: rechecking %d resources", name, len(affected))
                self.scheduler.recheck(affected)

    async def on_namespace_event(self, type: str | None, body: Any, **_: Any) -> None:
        name = str(body["metadata"]["name"])
        if type == "DELETED":
            self.directory.namespace_gone(name)
            return
        before, now = self.directory.namespace_seen(plain(body))
        if before is not None and before != now:
            affected = self.reconciler.affected(namespace=name)
            if before.labels != now.labels:
                classed = self.reconciler.class_affected(None, None, namespace=name)
                affected = sorted(set(affected) | set(classed))
            if affected:
                log.info("namespace %s changed: rechecking %d resources", name, len(affected))
                self.scheduler.recheck(affected)

    async def check_periodically(self, body: Any, **_: Any) -> None:
        await self.check(plain(body))

    async def release_account(self, body: Any, retry: int, **_: Any) -> None:
        """Deleting a CloudAccount waits until no resource lives in it or waits for it."""
        assert self.aws is not None
        raw = plain(body)
        name = str(raw["metadata"]["name"])
        users = await self.reconciler.in_thread(account_users, self.reconciler.kube, name)
        if users:
            more = f" and {len(users) - 10} more" if len(users) > 10 else ""
            shown = ", ".join(users[:10]) + more
            message = f"deletion waits: {len(users)} resources use CloudAccount {name}: {shown}"
            self.reconciler.post_event(
                raw | {"kind": accounts.KIND}, Event("Warning", "InUse", message)
            )
            raise kopf.TemporaryError(message, delay=min(30.0, 5.0 * (retry + 1)))
        self.aws.sessions.forget(name)


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    settings: Settings,
    scheduler: ResyncScheduler,
    aws: Aws | None,
) -> None:
    """Wire the CloudAccount controller into `registry` (the reconciler has a directory)."""
    assert reconciler.directory is not None
    controller = AccountsController(
        reconciler,
        reconciler.directory,
        scheduler,
        aws,
        manage=settings.manages_accounts and aws is not None,
    )
    kopf.on.event(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, id=ACCOUNT_WATCH, registry=registry)(
        controller.on_account_event
    )
    kopf.on.event("", "v1", "namespaces", id=NAMESPACE_WATCH, registry=registry)(
        controller.on_namespace_event
    )
    if not controller.manage:
        return
    kopf.on.delete(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, id=RELEASE, registry=registry)(
        controller.release_account
    )
    kopf.timer(GROUP, ACCOUNTS_VERSION, accounts.PLURAL, id=CHECK, interval=30, registry=registry)(
        controller.check_periodically
    )
