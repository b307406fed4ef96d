"""IAM roles that let a workload's pods use a resource (`spec.access`).

One role per (cluster, namespace, ServiceAccount), in the account the granting resource lives
in, path `/provisioner/`, tagged with the cluster, namespace and ServiceAccount; one inline
policy per granting resource, scoped to that resource's ARNs only. Names are deterministic,
so a repeated call after a crash finds what the interrupted one made.

The pod assumes the role one of two ways (`AccessSettings.mode`):
- IRSA: the trust policy names the cluster's OIDC provider, `sub` =
  `system:serviceaccount:<ns>:<sa>` and `aud` = `sts.amazonaws.com`; the ServiceAccount is
  annotated `eks.amazonaws.com/role-arn` (provisioner/access/grants.py does that).
- EKS Pod Identity: the trust policy lets `pods.eks.amazonaws.com` AssumeRole and TagSession,
  only for the session tags of that cluster, namespace and ServiceAccount; a pod identity
  association links them (EKS's API, in the cluster's account and region).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from provisioner.aws import errors
from provisioner.model import naming
from provisioner.model.resource import CLUSTER_TAG, NAMESPACE_TAG

if TYPE_CHECKING:
    from provisioner.aws.session import Aws
    from provisioner.kinds.contract import KindDescriptor
    from provisioner.model.account import AccountRef

LEVELS = ("read", "write", "admin")
IRSA, POD_IDENTITY, OFF = "irsa", "pod-identity", "off"
ROLE_PATH = "/provisioner/"
SERVICE_ACCOUNT_TAG = "provisioner.dev/service-account"
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
# IAM: "Role policy size: 10,240 characters" for all of a role's inline policies together
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html).
INLINE_POLICY_QUOTA = 10240


@dataclass(frozen=True)
class AccessSettings:
    mode: str = OFF  # off | irsa | pod-identity
    # IRSA: the cluster's OIDC issuer, as in the token's `iss` without "https://"
    # (oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE...).
    oidc_issuer: str = ""
    # Pod Identity: the EKS cluster's name (its associations are made in the operator's
    # own account and region, where the cluster is).
    eks_cluster: str = ""

    @property
    def on(self) -> bool:
        return self.mode != OFF

    def problem(self) -> str:
        """Why these settings cannot work ("" when they can)."""
        if self.mode not in (OFF, IRSA, POD_IDENTITY):
            return f"--access must be off, {IRSA} or {POD_IDENTITY}, not {self.mode!r}"
        if self.mode == IRSA and not self.oidc_issuer:
            return "--access=irsa needs --oidc-issuer (the cluster's OIDC issuer URL)"
        if self.mode == POD_IDENTITY and not self.eks_cluster:
            return "--access=pod-identity needs --eks-cluster (the EKS cluster's name)"
        return ""


def issuer_host(issuer: str) -> str:
    """`https://oidc.eks.../id/X/` -> `oidc.eks.../id/X` (how IAM names the provider)."""
    return issuer.strip().removeprefix("https://").rstrip("/")


def role_name(cluster_id: str, namespace: str, service_account: str) -> str:
    """The role of one ServiceAccount: `<namespace>-<sa>` squashed, plus a hash of the
    cluster, namespace and ServiceAccount (two clusters sharing an account never meet);
    at most IAM's 64 characters."""
    base = f"{namespace}-{service_account}"
    digest = naming.uid_hash(f"{cluster_id}/{namespace}/{service_account}", 10)
    room = 64 - len(digest) - 1
    return f"{base[:room].rstrip('-.')}-{digest}"


def policy_name(kind: str, name: str, uid: str) -> str:
    """The inline policy of one granting resource: kind, name and a hash of its uid (at
    most IAM's 128 characters)."""
    base = f"{kind}.{name}"
    digest = naming.uid_hash(uid, 10)
    return f"{base[: 128 - len(digest) - 1]}.{digest}"


def role_tags(cluster_id: str, namespace: str, service_account: str) -> dict[str, str]:
    return {
        CLUSTER_TAG: cluster_id,
        NAMESPACE_TAG: namespace,
        SERVICE_ACCOUNT_TAG: service_account,
    }


def permission_policy(descriptor: KindDescriptor, level: str, arns: list[str]) -> dict[str, Any]:
    """The inline policy of one grant: the level's actions on the resource's ARNs only.

    `arns` are what the kind grants on (`access_arns`: the resource's own ARN, or a
    database's master user secret and its KMS key). When they belong to several services,
    each service's actions get a statement of their own on that service's ARNs only, and a
    service without an ARN gets none. A KMS key granted beside another service's resources
    decrypts only through that service and only for those resources (`_through`): the key
    is named in the spec, and may be another team's."""
    resources = [r for a in arns for r in descriptor.access_resources(a)]
    actions = list(descriptor.access_actions[level])
    services = sorted({_service(r) for r in resources})
    if len(services) <= 1:
        named = [a for a in actions if not services or a.split(":")[0] == services[0]]
        return {
            "Version": "2012-10-17",
            "Statement": [_statement("ProvisionerAccess", named or actions, resources)],
        }
    statements = []
    for service in services:
        chosen = [a for a in actions if a.split(":")[0] == service]
        if not chosen:
            continue
        own = [r for r in resources if _service(r) == service]
        statement = _statement(f"ProvisionerAccess{service.capitalize()}", chosen, own)
        if service == "kms":
            others = [r for r in resources if _service(r) != "kms"]
            statement["Condition"] = _through(others, own)
        statements.append(statement)
    return {"Version": "2012-10-17", "Statement": statements}


# The encryption context a service puts on its KMS calls, naming the resource they are for
# (Secrets Manager: "SecretARN", https://docs.aws.amazon.com/secretsmanager/latest/userguide/
# security-encryption.html#security-encryption-encryption-context).
ENCRYPTION_CONTEXT = {"secretsmanager": "SecretARN"}


def _through(resources: list[str], keys: list[str]) -> dict[str, Any]:
    """The condition of a key's statement: used by the service of `resources` on the key's
    region's endpoint (`kms:ViaService`), for those resources (their encryption context)."""
    services = sorted({_service(r) for r in resources})
    regions = sorted({k.split(":")[3] for k in keys if len(k.split(":")) > 3})
    equals: dict[str, Any] = {
        "kms:ViaService": [f"{s}.{r}.amazonaws.com" for s in services for r in regions]
    }
    for service in services:
        if service in ENCRYPTION_CONTEXT:
            equals[f"kms:EncryptionContext:{ENCRYPTION_CONTEXT[service]}"] = [
                r for r in resources if _service(r) == service
            ]
    return {"StringEquals": equals}


def _service(arn: str) -> str:
    """An ARN's service (arn:partition:service:...)."""
    parts = arn.split(":")
    return parts[2] if len(parts) > 2 else ""


def _statement(sid: str, actions: list[str], resources: list[str]) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}


def trust_policy(
    settings: AccessSettings, partition: str, account_id: str, namespace: str, sa: str
) -> dict[str, Any]:
    """Who may assume the role: that ServiceAccount's pods in this cluster, nobody else."""
    if settings.mode == POD_IDENTITY:
        statement: dict[str, Any] = {
            "Sid": "EksPodIdentity",
            "Effect": "Allow",
            "Principal": {"Service": "pods.eks.amazonaws.com"},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
            "Condition": {
                "StringEquals": {
                    "aws:RequestTag/eks-cluster-name": settings.eks_cluster,
                    "aws:RequestTag/kubernetes-namespace": namespace,
                    "aws:RequestTag/kubernetes-service-account": sa,
                }
            },
        }
    else:
        issuer = issuer_host(settings.oidc_issuer)
        statement = {
            "Sid": "ServiceAccountWebIdentity",
            "Effect": "Allow",
            "Principal": {"Federated": oidc_provider_arn(partition, account_id, issuer)},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {
                "StringEquals": {
                    f"{issuer}:sub": f"system:serviceaccount:{namespace}:{sa}",
                    f"{issuer}:aud": "sts.amazonaws.com",
                }
            },
        }
    return {"Version": "2012-10-17", "Statement": [statement]}


def oidc_provider_arn(partition: str, account_id: str, issuer: str) -> str:
    return f"arn:{partition}:iam::{account_id}:oidc-provider/{issuer_host(issuer)}"


def role_arn(partition: str, account_id: str, name: str) -> str:
    return f"arn:{partition}:iam::{account_id}:role{ROLE_PATH}{name}"


def _document(value: Any) -> dict[str, Any]:
    """A policy document as IAM returns it (decoded by botocore, or still a string)."""
    if isinstance(value, str):
        return dict(json.loads(unquote(value)))
    return dict(value or {})


@dataclass(frozen=True)
class Role:
    name: str
    arn: str
    tags: dict[str, str]
    trust: dict[str, Any]

    def owned_by(self, cluster_id: str, namespace: str, service_account: str) -> bool:
        wanted = role_tags(cluster_id, namespace, service_account)
        return all(self.tags.get(k) == v for k, v in wanted.items())


@dataclass(frozen=True)
class Association:
    id: str
    role_arn: str


class IamClient:
    """The IAM (and EKS Pod Identity) calls of `spec.access`; every method is idempotent."""

    def __init__(self, aws: Aws) -> None:
        self.aws = aws

    def _iam(self, account: AccountRef | None) -> Any:
        return self.aws.client("iam", None, account)

    def get_role(self, account: AccountRef | None, name: str) -> Role | None:
        iam = self._iam(account)
        try:
            role = self.aws.call(iam.get_role, RoleName=name)["Role"]
        except errors.NotFoundError:
            return None
        return Role(
            name=name,
            arn=str(role["Arn"]),
            tags={t["Key"]: t["Value"] for t in role.get("Tags") or []},
            trust=_document(role.get("AssumeRolePolicyDocument")),
        )

    def create_role(
        self,
        account: AccountRef | None,
        name: str,
        trust: dict[str, Any],
        tags: dict[str, str],
        description: str,
    ) -> Role:
        iam = self._iam(account)
        try:
            self.aws.call(
                iam.create_role,
                RoleName=name,
                Path=ROLE_PATH,
                AssumeRolePolicyDocument=json.dumps(trust),
                Description=description[:1000],
                MaxSessionDuration=3600,
                Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            )
        except errors.CloudError as exc:
            if exc.code != "EntityAlreadyExists":  # an earlier create's answer was lost
                raise
        role = self.get_role(account, name)
        if role is None:
            raise errors.RetryableError(f"IAM role {name} not readable right after its create")
        return role

    def update_trust(self, account: AccountRef | None, name: str, trust: dict[str, Any]) -> None:
        iam = self._iam(account)
        self.aws.call(
            iam.update_assume_role_policy, RoleName=name, PolicyDocument=json.dumps(trust)
        )

    def get_policy(self, account: AccountRef | None, role: str, policy: str) -> dict[str, Any]:
        """The inline policy's document ({} when the role has no such policy)."""
        iam = self._iam(account)
        try:
            found = self.aws.call(iam.get_role_policy, RoleName=role, PolicyName=policy)
        except errors.NotFoundError:
            return {}
        return _document(found.get("PolicyDocument"))

    def put_policy(
        self, account: AccountRef | None, role: str, policy: str, document: dict[str, Any]
    ) -> None:
        iam = self._iam(account)
        try:
            self.aws.call(
                iam.put_role_policy,
                RoleName=role,
                PolicyName=policy,
                PolicyDocument=json.dumps(document),
            )
        except errors.CloudError as exc:
            if exc.code == "LimitExceeded":
                raise errors.TerminalError(
                    f"IAM role {role} holds too many grants: IAM allows {INLINE_POLICY_QUOTA} "
                    "characters of inline policy per role (spread the grants over more "
                    "ServiceAccounts)",
                    exc.code,
                ) from None
            raise

    def delete_policy(self, account: AccountRef | None, role: str, policy: str) -> bool:
        """Whether there was such a policy to delete."""
        iam = self._iam(account)
        try:
            self.aws.call(iam.delete_role_policy, RoleName=role, PolicyName=policy)
        except errors.NotFoundError:
            return False
        return True

    def policy_names(self, account: AccountRef | None, role: str) -> list[str]:
        iam = self._iam(account)
        try:
            return list(_pages(self.aws.call, iam.list_role_policies, "PolicyNames", RoleName=role))
        except errors.NotFoundError:
            return []

    def delete_role(self, account: AccountRef | None, name: str) -> bool:
        """Deletes the role unless a policy was put on it meanwhile (IAM refuses to delete a
        role that has one: DeleteConflict); whether it is gone."""
        iam = self._iam(account)
        try:
            self.aws.call(iam.delete_role, RoleName=name)
        except errors.NotFoundError:
            return True
        except errors.CloudError as exc:
            if exc.code == "DeleteConflict":
                return False
            raise
        return True

    def oidc_provider_exists(self, account: AccountRef | None, arn: str) -> bool:
        iam = self._iam(account)
        try:
            self.aws.call(iam.get_open_id_connect_provider, OpenIDConnectProviderArn=arn)
        except errors.NotFoundError:
            return False
        return True

    # EKS Pod Identity: associations live with the cluster (the operator's own account).

    def _eks(self) -> Any:
        return self.aws.client("eks")

    def association(self, cluster: str, namespace: str, sa: str) -> Association | None:
        eks = self._eks()
        listed = self.aws.call(
            eks.list_pod_identity_associations,
            clusterName=cluster,
            namespace=namespace,
            serviceAccount=sa,
        ).get("associations", [])
        if not listed:
            return None
        found = self.aws.call(
            eks.describe_pod_identity_association,
            clusterName=cluster,
            associationId=listed[0]["associationId"],
        )["association"]
        return Association(str(found["associationId"]), str(found.get("roleArn") or ""))

    def create_association(
        self, cluster: str, namespace: str, sa: str, role: str, tags: dict[str, str]
    ) -> None:
        eks = self._eks()
        try:
            self.aws.call(
                eks.create_pod_identity_association,
                clusterName=cluster,
                namespace=namespace,
                serviceAccount=sa,
                roleArn=role,
                tags=tags,
            )
        except errors.CloudError as exc:
            if exc.code != "ResourceInUseException":  # made by an earlier, interrupted call
                raise

    def delete_association(self, cluster: str, association_id: str) -> None:
        eks = self._eks()
        try:
            self.aws.call(
                eks.delete_pod_identity_association,
                clusterName=cluster,
                associationId=association_id,
            )
        except errors.NotFoundError:
            pass


@dataclass(frozen=True)
class ListedRole:
    """A role of ours found by listing, for `provisioner leaks`."""

    name: str
    tags: dict[str, str]
    policies: tuple[str, ...]


def list_roles(cloud: Any, cluster_id: str) -> Iterator[ListedRole]:
    """The roles under `/provisioner/` tagged with `cluster_id`, with their inline policies.
    `cloud`: `Aws` or anything with its `client` and `call` (the leak finder's per account)."""
    iam = cloud.client("iam")
    for listed in _pages(cloud.call, iam.list_roles, "Roles", PathPrefix=ROLE_PATH):
        name = str(listed["RoleName"])
        try:
            role = cloud.call(iam.get_role, RoleName=name)["Role"]
            policies = tuple(
                _pages(cloud.call, iam.list_role_policies, "PolicyNames", RoleName=name)
            )
        except errors.NotFoundError:
            continue  # deleted since it was listed
        tags = {t["Key"]: t["Value"] for t in role.get("Tags") or []}
        if tags.get(CLUSTER_TAG) == cluster_id:
            yield ListedRole(name, tags, policies)


def _pages(
    call: Callable[..., Any], fn: Callable[..., Any], key: str, **kwargs: Any
) -> Iterator[Any]:
    """Every item under `key` of an IAM listing, page after page (Marker, IsTruncated), each
    page one `call` (with its retries)."""
    marker: dict[str, str] = {}
    while True:
        page = call(fn, **kwargs, **marker)
        yield from page.get(key) or []
        if not page.get("IsTruncated"):
            return
        marker = {"Marker": page["Marker"]}
