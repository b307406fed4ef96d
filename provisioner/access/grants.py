"""`spec.access`: the grants of one resource to ServiceAccounts of its namespace.

A grant is an inline policy (named after the resource) on the ServiceAccount's role
(provisioner/access/iam.py), plus, with IRSA, the ServiceAccount's `eks.amazonaws.com/role-arn`
annotation, or with EKS Pod Identity, a pod identity association.

Order, so that a crash anywhere leaves nothing behind and nothing twice:
1. look (role, ServiceAccount or association): something of that name that is not ours
   (a role without our tags, an annotation or association naming another role) is refused
   and nothing is changed;
2. record the ServiceAccount in `status.access` before the first call that creates anything:
   a grant removed from the spec after a crash is still known and revoked;
3. role (create, or correct its trust policy), policy, then the annotation or association.
Revoking: the policy, then, when the role holds no other policy, the annotation or
association and the role; the entry leaves `status.access` last.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from provisioner.access import iam
from provisioner.access.iam import AccessSettings, IamClient
from provisioner.aws.session import Aws
from provisioner.crashpoints import crashpoint
from provisioner.kinds import registry as kinds
from provisioner.kube.client import Kube
from provisioner.model import conditions as cond
from provisioner.model.resource import Resource

InThread = Callable[..., Awaitable[Any]]


@dataclass
class Outcome:
    """What converging the grants found: `status.access`, Events, and the problem (one
    Synced=False condition) when a grant could not be made."""

    entries: list[dict[str, str]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # type, reason, message
    problem: cond.Condition | None = None
    # The problem may go away by itself (a ServiceAccount not created yet): look again soon;
    # False: people must act (a conflict), look again slowly.
    retry: bool = False


def revoked(sa: str) -> tuple[str, str, str]:
    """The Event of a revoked grant."""
    return ("Normal", "AccessRevoked", f"ServiceAccount {sa}: access revoked")


class Refused(Exception):
    def __init__(self, reason: str, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry = reason, message, retry


class Access:
    def __init__(
        self,
        settings: AccessSettings,
        cluster_id: str,
        aws: Aws | None,
        kube: Kube,
        in_thread: InThread,
    ) -> None:
        self.settings = settings
        self.cluster_id = cluster_id
        self.aws = aws
        self.iam = IamClient(aws) if aws is not None else None
        self.kube = kube
        self.in_thread = in_thread
        # One grant or revocation at a time per role: two resources granting one
        # ServiceAccount never race on its role, its annotation or its association.
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)

    # -- names --------------------------------------------------------------------------

    def _role(self, resource: Resource, sa: str) -> str:
        return iam.role_name(self.cluster_id, resource.namespace, sa)

    def _lock(self, resource: Resource, sa: str) -> asyncio.Lock:
        account = resource.account.name if resource.account else ""
        return self.locks[(account, self._role(resource, sa))]

    # -- converge -----------------------------------------------------------------------

    @staticmethod
    def held(resource: Resource) -> dict[str, dict[str, str]]:
        return {
            str(e.get("serviceAccountName")): dict(e)
            for e in resource.status.get("access") or []
            if e.get("serviceAccountName")
        }

    async def converge(self, resource: Resource, arn: str) -> Outcome | None:
        """Grant what `spec.access` asks, revoke what it no longer does; None when the
        resource has no grants at all (nothing is called)."""
        desired = dict(resource.access)
        held = self.held(resource)
        if not desired and not held:
            return None
        why_not = self._why_not(resource, desired)
        if why_not is not None:  # nothing is granted or revoked; what is held stays recorded
            problem = cond.Condition(cond.SYNCED, False, *why_not) if desired else None
            return Outcome(entries=list(held.values()), problem=problem)
        outcome = Outcome()
        for sa in [s for s in held if s not in desired]:
            async with self._lock(resource, sa):
                await self._revoke(resource, sa, held)
            outcome.events.append(revoked(sa))
        problems: list[Refused] = []
        for sa, level in desired.items():
            async with self._lock(resource, sa):
                try:
                    changed = await self._grant(resource, sa, level, arn, held)
                except Refused as refused:
                    problems.append(refused)  # what is held for it stays: ours to revoke
                    continue
            if changed:
                via = held[sa]["roleArn"]
                outcome.events.append(
                    ("Normal", "AccessGranted", f"ServiceAccount {sa}: {level} via {via}")
                )
        outcome.entries = list(held.values())
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            outcome.problem = cond.Condition(cond.SYNCED, False, first.reason, first.message + more)
            outcome.retry = any(p.retry for p in problems)
        return outcome

    def _why_not(self, resource: Resource, desired: dict[str, str]) -> tuple[str, str] | None:
        """Why this operator makes no grant for the resource at all (reason, message)."""
        if not self.settings.on or self.iam is None:
            return (
                cond.ACCESS_DISABLED,
                "spec.access: this operator grants no access (started with --access=off)",
            )
        if self.settings.mode == iam.POD_IDENTITY and resource.account is not None and desired:
            return (
                cond.ACCESS_NOT_SUPPORTED,
                "spec.access with EKS Pod Identity: the role must be in the cluster's own "
                f"account, and this resource lives in CloudAccount {resource.account.name}",
            )
        return None

    async def _record(self, resource: Resource, held: dict[str, dict[str, str]]) -> None:
        """Write `held` to status.access now: before anything is made for a new entry, after
        everything of a removed one is gone."""
        entries = list(held.values())
        await self.in_thread(
            self.kube.patch_status,
            resource.kind,
            resource.namespace,
            resource.name,
            {"access": entries},
        )
        resource.status["access"] = entries

    async def _grant(
        self,
        resource: Resource,
        sa: str,
        level: str,
        arn: str,
        held: dict[str, dict[str, str]],
    ) -> bool:
        """Make one grant (its entry in `held` and status.access first); whether anything
        was written."""
        client = self.iam
        assert client is not None and self.aws is not None
        account, ns = resource.account, resource.namespace
        name = self._role(resource, sa)
        partition = self.aws.partition(resource.region)
        account_id = await self.in_thread(self.aws.account_id, account)
        role_arn = iam.role_arn(partition, account_id, name)
        irsa = self.settings.mode == iam.IRSA

        # 1. Look: refuse anything of these names that is not ours.
        role = await self.in_thread(client.get_role, account, name)
        if role is not None and not role.owned_by(self.cluster_id, ns, sa):
            raise Refused(
                cond.ACCESS_CONFLICT,
                f"ServiceAccount {sa}: IAM role {name} exists and is not provisioner's for it "
                "(its tags differ); it is left untouched",
                retry=False,
            )
        service_account: dict[str, Any] | None = None
        association: iam.Association | None = None
        if irsa:
            service_account = await self.in_thread(self.kube.get_service_account, ns, sa)
            annotated = _annotation(service_account)
            if annotated and annotated != role_arn:
                raise Refused(
                    cond.ACCESS_CONFLICT,
                    f"ServiceAccount {sa} is annotated {iam.ROLE_ANNOTATION}={annotated}, "
                    "another role; it is left untouched",
                    retry=False,
                )
            if role is None:
                provider = iam.oidc_provider_arn(partition, account_id, self.settings.oidc_issuer)
                if not await self.in_thread(client.oidc_provider_exists, account, provider):
                    raise Refused(
                        cond.OIDC_PROVIDER_NOT_FOUND,
                        f"ServiceAccount {sa}: the account has no IAM OIDC provider {provider} "
                        "for this cluster's issuer: an administrator registers it once per "
                        "account",
                    )
        else:
            association = await self.in_thread(
                client.association, self.settings.eks_cluster, ns, sa
            )
            if association is not None and association.role_arn != role_arn:
                raise Refused(
                    cond.ACCESS_CONFLICT,
                    f"ServiceAccount {sa} has a pod identity association with another role "
                    f"({association.role_arn}); it is left untouched",
                    retry=False,
                )

        # 2. Recorded before anything is made.
        entry = {"serviceAccountName": sa, "level": level, "roleArn": role_arn}
        if held.get(sa) != entry:
            held[sa] = entry
            await self._record(resource, held)

        # 3. The role, its policy, then the annotation or the association.
        changed = False
        trust = iam.trust_policy(self.settings, partition, account_id, ns, sa)
        tags = iam.role_tags(self.cluster_id, ns, sa)
        if role is None:
            await self.in_thread(
                client.create_role,
                account,
                name,
                trust,
                tags,
                f"spec.access of ServiceAccount {ns}/{sa} (cluster {self.cluster_id})",
            )
            crashpoint("after-create-role")
            changed = True
        elif role.trust != trust:
            await self.in_thread(client.update_trust, account, name, trust)
            changed = True
        document = iam.permission_policy(kinds.descriptor(resource.kind), level, arn)
        policy = iam.policy_name(resource.kind, resource.name, resource.uid)
        if await self.in_thread(client.get_policy, account, name, policy) != document:
            await self.in_thread(client.put_policy, account, name, policy, document)
            crashpoint("after-put-policy")
            changed = True
        if irsa:
            if service_account is None:
                raise Refused(
                    cond.SERVICE_ACCOUNT_NOT_FOUND,
                    f"ServiceAccount {sa} does not exist in {ns}: its role {role_arn} is ready "
                    f"and the ServiceAccount is annotated {iam.ROLE_ANNOTATION} once it exists",
                )
            if _annotation(service_account) != role_arn:
                meta = service_account["metadata"]
                await self.in_thread(
                    self.kube.annotate_service_account,
                    ns,
                    sa,
                    iam.ROLE_ANNOTATION,
                    role_arn,
                    str(meta.get("resourceVersion") or ""),
                )
                changed = True
        elif association is None:
            await self.in_thread(
                client.create_association, self.settings.eks_cluster, ns, sa, role_arn, tags
            )
            changed = True
        return changed

    async def _revoke(self, resource: Resource, sa: str, held: dict[str, dict[str, str]]) -> None:
        """Remove the resource's policy; the role (and annotation, association) when it was
        the last one; then its entry from `held` and status.access."""
        client = self.iam
        assert client is not None
        account, ns = resource.account, resource.namespace
        name = self._role(resource, sa)
        await self.in_thread(
            client.delete_policy,
            account,
            name,
            iam.policy_name(resource.kind, resource.name, resource.uid),
        )
        crashpoint("after-delete-policy")
        if not await self.in_thread(client.policy_names, account, name):
            role = await self.in_thread(client.get_role, account, name)
            if role is not None and role.owned_by(self.cluster_id, ns, sa):
                if self.settings.mode == iam.IRSA:
                    await self.in_thread(
                        self.kube.remove_service_account_annotation,
                        ns,
                        sa,
                        iam.ROLE_ANNOTATION,
                        role.arn,
                    )
                elif self.settings.mode == iam.POD_IDENTITY:
                    association = await self.in_thread(
                        client.association, self.settings.eks_cluster, ns, sa
                    )
                    if association is not None and association.role_arn == role.arn:
                        await self.in_thread(
                            client.delete_association, self.settings.eks_cluster, association.id
                        )
                await self.in_thread(client.delete_role, account, name)
        del held[sa]
        await self._record(resource, held)

    async def revoke_all(self, resource: Resource) -> list[tuple[str, str, str]]:
        """Every grant the resource holds, revoked (at its deletion); their Events. A grant
        it only asks for made nothing: status.access records each before anything is made."""
        held = self.held(resource)
        if self.iam is None:
            return []
        events = []
        for sa in list(held):
            async with self._lock(resource, sa):
                await self._revoke(resource, sa, held)
            events.append(revoked(sa))
        return events


def _annotation(service_account: dict[str, Any] | None) -> str:
    if not service_account:
        return ""
    annotations = (service_account.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(iam.ROLE_ANNOTATION) or "")
