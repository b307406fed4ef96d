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
from provisioner.model.account import AccountRef
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

    async def converge(self, resource: Resource, arns: list[str]) -> Outcome | None:
        """Grant what `spec.access` asks, revoke what it no longer does; None when the
        resource has no grants at all (nothing is called). `arns`: what its kind grants on (none
        yet: the grants wait, AccessPending)."""
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
            if not arns:
                problems.append(Refused(cond.ACCESS_PENDING, _nothing_yet(resource, sa)))
                continue
            async with self._lock(resource, sa):
                try:
                    changed = await self._grant(resource, sa, level, arns, held)
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
        arns: list[str],
        held: dict[str, dict[str, str]],
    ) -> bool:
        """Make one grant (its entry in `held` and status.access first); whether anything
        was written."""
        grant = await self._named(resource, sa, level)
        # 1. Look: refuse anything of these names that is not ours.
        await grant.look()
        # 2. Recorded before anything is made.
        entry = {"serviceAccountName": sa, "level": level, "roleArn": grant.role_arn}
        if held.get(sa) != entry:
            held[sa] = entry
            await self._record(resource, held)
        # 3. The role, its policy, then the annotation or the association.
        role_written = await grant.make_role()
        policy_written = await grant.put_policy(arns)
        bound = await grant.bind()
        return role_written or policy_written or bound

    async def _named(self, resource: Resource, sa: str, level: str) -> Grant:
        """The grant of `level` on `resource` to `sa`, with the names of its role."""
        assert self.iam is not None and self.aws is not None
        name = self._role(resource, sa)
        partition = self.aws.partition(resource.region)
        account_id = await self.in_thread(self.aws.account_id, resource.account)
        return Grant(
            access=self,
            client=self.iam,
            resource=resource,
            sa=sa,
            level=level,
            name=name,
            partition=partition,
            account_id=account_id,
            role_arn=iam.role_arn(partition, account_id, name),
        )

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


@dataclass
class Grant:
    """One grant being made, step by step (the order above): its role's names, and what
    the look found of the role, the ServiceAccount and its pod identity association."""

    access: Access
    client: IamClient
    resource: Resource
    sa: str
    level: str
    name: str  # the role's
    partition: str
    account_id: str
    role_arn: str
    role: iam.Role | None = None
    service_account: dict[str, Any] | None = None
    association: iam.Association | None = None

    @property
    def account(self) -> AccountRef | None:
        return self.resource.account

    @property
    def ns(self) -> str:
        return self.resource.namespace

    @property
    def irsa(self) -> bool:
        return self.access.settings.mode == iam.IRSA

    async def look(self) -> None:
        """Read the role, then the ServiceAccount (IRSA) or its association; Refused when
        any of them is not ours, or, for a role still to be made, there is no OIDC provider."""
        access = self.access
        self.role = await access.in_thread(self.client.get_role, self.account, self.name)
        if self.role is not None and not self.role.owned_by(access.cluster_id, self.ns, self.sa):
            raise Refused(
                cond.ACCESS_CONFLICT,
                f"ServiceAccount {self.sa}: IAM role {self.name} exists and is not "
                "provisioner's for it (its tags differ); it is left untouched",
                retry=False,
            )
        if self.irsa:
            await self._look_at_service_account()
        else:
            await self._look_at_association()

    async def _look_at_service_account(self) -> None:
        access = self.access
        self.service_account = await access.in_thread(
            access.kube.get_service_account, self.ns, self.sa
        )
        annotated = _annotation(self.service_account)
        if annotated and annotated != self.role_arn:
            raise Refused(
                cond.ACCESS_CONFLICT,
                f"ServiceAccount {self.sa} is annotated {iam.ROLE_ANNOTATION}={annotated}, "
                "another role; it is left untouched",
                retry=False,
            )
        if self.role is None:
            issuer = access.settings.oidc_issuer
            provider = iam.oidc_provider_arn(self.partition, self.account_id, issuer)
            if not await access.in_thread(self.client.oidc_provider_exists, self.account, provider):
                raise Refused(
                    cond.OIDC_PROVIDER_NOT_FOUND,
                    f"ServiceAccount {self.sa}: the account has no IAM OIDC provider {provider} "
                    "for this cluster's issuer: an administrator registers it once per account",
                )

    async def _look_at_association(self) -> None:
        cluster = self.access.settings.eks_cluster
        self.association = await self.access.in_thread(
            self.client.association, cluster, self.ns, self.sa
        )
        if self.association is not None and self.association.role_arn != self.role_arn:
            raise Refused(
                cond.ACCESS_CONFLICT,
                f"ServiceAccount {self.sa} has a pod identity association with another role "
                f"({self.association.role_arn}); it is left untouched",
                retry=False,
            )

    async def make_role(self) -> bool:
        """Create the role, or correct its trust policy; whether anything was written."""
        access = self.access
        trust = iam.trust_policy(access.settings, self.partition, self.account_id, self.ns, self.sa)
        if self.role is None:
            await access.in_thread(
                self.client.create_role,
                self.account,
                self.name,
                trust,
                iam.role_tags(access.cluster_id, self.ns, self.sa),
                f"spec.access of ServiceAccount {self.ns}/{self.sa} (cluster {access.cluster_id})",
            )
            crashpoint("after-create-role")
            return True
        if self.role.trust != trust:
            await access.in_thread(self.client.update_trust, self.account, self.name, trust)
            return True
        return False

    async def put_policy(self, arns: list[str]) -> bool:
        """The role's policy on `arns`, unless it is already so; whether it
        was written."""
        resource, in_thread = self.resource, self.access.in_thread
        document = iam.permission_policy(kinds.descriptor(resource.kind), self.level, arns)
        policy = iam.policy_name(resource.kind, resource.name, resource.uid)
        if await in_thread(self.client.get_policy, self.account, self.name, policy) == document:
            return False
        await in_thread(self.client.put_policy, self.account, self.name, policy, document)
        crashpoint("after-put-policy")
        return True

    async def bind(self) -> bool:
        """Annotate the ServiceAccount (IRSA), or make its association; whether anything was
        written. Refused when the ServiceAccount is not there yet (IRSA)."""
        access = self.access
        if not self.irsa:
            if self.association is not None:
                return False
            tags = iam.role_tags(access.cluster_id, self.ns, self.sa)
            cluster = access.settings.eks_cluster
            await access.in_thread(
                self.client.create_association, cluster, self.ns, self.sa, self.role_arn, tags
            )
            return True
        if self.service_account is None:
            raise Refused(
                cond.SERVICE_ACCOUNT_NOT_FOUND,
                f"ServiceAccount {self.sa} does not exist in {self.ns}: its role {self.role_arn} "
                f"is ready and the ServiceAccount is annotated {iam.ROLE_ANNOTATION} once it "
                "exists",
            )
        if _annotation(self.service_account) == self.role_arn:
            return False
        version = str(self.service_account["metadata"].get("resourceVersion") or "")
        await access.in_thread(
            access.kube.annotate_service_account,
            self.ns,
            self.sa,
            iam.ROLE_ANNOTATION,
            self.role_arn,
            version,
        )
        return True


def _nothing_yet(resource: Resource, sa: str) -> str:
    return (
        f"ServiceAccount {sa}: the {resource.kind} has nothing to grant on yet (a database's "
        "master user secret appears once Secrets Manager keeps its password); granted then"
    )


def _annotation(service_account: dict[str, Any] | None) -> str:
    if not service_account:
        return ""
    annotations = (service_account.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(iam.ROLE_ANNOTATION) or "")
