"""Stage: placement. The account and region a resource acts in, before any cloud call;
AccountRefused when it may not act there."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused, Directory
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers


class Placement:
    def __init__(
        self,
        settings: Settings,
        directory: Directory | None,
        own_account: Callable[[], str] | None,
        workers: Workers,
        states: States,
    ) -> None:
        self.settings = settings
        # CloudAccounts and namespaces (None: this operator serves no CloudAccounts).
        self.directory = directory
        # The operator's own account id, for status.accountId (asked of STS once).
        self.own_account = own_account
        self.workers = workers
        self.states = states

    async def place(self, resource: Resource, deleting: bool = False) -> Resource:
        """The resource with the account and region it acts in; AccountRefused when it may
        not act there (before any cloud call)."""
        directory = self.directory
        Directory.check_region(
            directory, resource.spec_region, resource.status, self.settings, deleting
        )
        attempted = resource.spec_account or str(resource.status.get("account") or "")
        if directory is None:
            if resource.spec_account:
                raise AccountRefused(
                    cond.ACCOUNT_NOT_FOUND,
                    f"CloudAccount {resource.spec_account}: this operator serves no "
                    "CloudAccounts (started with --accounts=off)",
                )
            return resource
        state = self.states.of(resource.uid)
        try:
            placement = await self.workers.in_thread(
                directory.place,
                resource.namespace,
                resource.spec_account,
                resource.spec_region,
                resource.status,
                self.settings.region,
                deleting,
            )
        except AccountRefused:
            if not attempted:
                attempted = directory.namespace(resource.namespace).default_account
            state.placed = (resource.namespace, attempted)
            raise
        account = placement.account
        state.placed = (resource.namespace, account.name if account else "")
        tags = resource.user_tags
        if account is not None and account.tags:
            tags = {**account.tags, **tags}  # the account's under the class's and its own
        return dataclasses.replace(
            resource,
            region=placement.region,
            account=account.ref if account else None,
            user_tags=tags,
        )

    def known(self, resource: Resource) -> Resource:
        """Where a resource that already lives somewhere is, from its status and the
        CloudAccounts already known (no API call): for the resync schedule of one at rest
        after a restart. Unknown: the resource as it is (its first pass places it)."""
        if self.directory is None or "account" not in resource.status:
            return resource
        name = str(resource.status.get("account") or "")
        account = self.directory.accounts.get(name) if name else None
        if name and account is None:
            return resource
        region = resource.spec_region or str(resource.status.get("region") or resource.region)
        return dataclasses.replace(
            resource, region=region, account=account.ref if account else None
        )

    def affected(self, *, account: str | None = None, namespace: str | None = None) -> list[str]:
        """The resources to look at again after a change of the CloudAccount `account` (those
        placed in it or refused it), or of `namespace` (those in it that use or were refused
        a CloudAccount)."""
        found = []
        for uid, state in self.states.items():
            if state.placed is None:
                continue
            ns, name = state.placed
            if (account is not None and name == account) or (
                namespace is not None and ns == namespace and (name or state.refused)
            ):
                found.append(uid)
        return found

    def fields(self, resource: Resource) -> dict[str, Any]:
        """status.account ("" for the operator's own), accountId and region (nothing when
        this operator serves no CloudAccounts: the status then reads as before them)."""
        if self.directory is None:
            return {}
        return {
            "account": resource.account.name if resource.account else "",
            "accountId": self._account_id(resource),
            "region": resource.region,
        }

    def _account_id(self, resource: Resource) -> str:
        if resource.account is not None:
            return resource.account.account_id
        try:
            return self.own_account() if self.own_account else ""
        except errors.CloudError:
            return ""  # only a label: unknown while STS does not say (an endpoint without it)

    def unplaced(self, resource: Resource) -> bool:
        """Whether a create must pin the account and region in status before its call: once
        the cluster has CloudAccounts at all (a cluster without any pays no extra write per
        create: its resources can only live in one account)."""
        return (
            self.directory is not None
            and "account" not in resource.status
            and self.directory.in_use()
        )
