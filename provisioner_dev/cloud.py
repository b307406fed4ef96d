"""The local cloud (moto, LocalStack) as a client sees it: boto3 clients and an inventory.

`inventory()` is `provisioner leaks`' own listing (each kind's `list_resources` in the
registry), so the tests, bench/ and `provisioner leaks` count the same resources the same way.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import boto3
import botocore.config

from provisioner import ACCOUNTS_API_VERSION
from provisioner.aws.session import classify
from provisioner.kinds.contract import OwnedResource
from provisioner.kinds.registry import ERROR_CODES
from provisioner.tools.leaks import cloud_resources
from provisioner_dev.awsenv import DEV_CREDENTIALS, DEV_REGION

T = TypeVar("T")

__all__ = [
    "DevCloud",
    "OwnedResource",
    "by_owner",
    "cloud_account",
    "create_role",
    "in_account",
    "inventory",
]

# Who may assume the roles `create_role` makes: the operator's own account (moto's default).
TRUST_OPERATOR = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
)


class DevCloud:
    """boto3 clients for one local endpoint, with the dev credentials; made once, thread-safe.

    `user_agent` is added to every request's User-Agent (bench/ tells its own calls apart
    in moto's recording with it).
    """

    def __init__(
        self,
        endpoint_url: str,
        *,
        user_agent: str | None = None,
        credentials: dict[str, str] | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.config = botocore.config.Config(
            user_agent_extra=user_agent,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
            s3={"addressing_style": "path"},
        )
        # Another account's: AssumeRole's answer (moto acts in the role's account).
        keys = credentials or {
            "AccessKeyId": DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "SecretAccessKey": DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }
        self._session = boto3.session.Session(
            aws_access_key_id=keys["AccessKeyId"],
            aws_secret_access_key=keys["SecretAccessKey"],
            aws_session_token=keys.get("SessionToken"),
            region_name=DEV_REGION,
        )
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self.codes = ERROR_CODES

    def client(self, service: str, region: str | None = None) -> Any:
        key = (service, region or DEV_REGION)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._session.client(
                    service, endpoint_url=self.endpoint_url, config=self.config, region_name=key[1]
                )
            return self._clients[key]

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(...)`, with its failure classified as the operator classifies it."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified right here
            raise classify(exc, self.codes) from None


def in_account(
    endpoint_url: str, account_id: str, role: str, *, user_agent: str | None = None
) -> DevCloud:
    """A DevCloud acting in `account_id` through `role` there (moto: any role may be assumed,
    existing or not; the aws-like proxy in front of it refuses a role that does not exist)."""
    sts = DevCloud(endpoint_url, user_agent=user_agent).client("sts")
    answer = sts.assume_role(
        RoleArn=f"arn:aws:iam::{account_id}:role/{role}", RoleSessionName="provisioner-dev"
    )
    return DevCloud(endpoint_url, user_agent=user_agent, credentials=answer["Credentials"])


def create_role(
    endpoint_url: str,
    account_id: str,
    role: str,
    trust: str = TRUST_OPERATOR,
    *,
    user_agent: str | None = None,
) -> str:
    """A role in `account_id`'s IAM, made straight at moto; its ARN (one that exists is kept)."""
    iam = in_account(endpoint_url, account_id, "setup", user_agent=user_agent).client("iam")
    try:
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=trust)
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    return f"arn:aws:iam::{account_id}:role/{role}"


def cloud_account(
    name: str,
    role_arn: str,
    match_labels: dict[str, str],
    *,
    regions: list[str] | None = None,
    default_region: str | None = None,
) -> dict[str, Any]:
    """A CloudAccount for the role `role_arn` (its account taken from the ARN), selecting the
    namespaces with `match_labels`."""
    spec: dict[str, Any] = {
        "accountId": role_arn.split(":")[4],
        "roleArn": role_arn,
        "namespaceSelector": {"matchLabels": match_labels},
    }
    if regions:
        spec["regions"] = regions
    if default_region:
        spec["defaultRegion"] = default_region
    return {
        "apiVersion": ACCOUNTS_API_VERSION,
        "kind": "CloudAccount",
        "metadata": {"name": name},
        "spec": spec,
    }


def inventory(
    cloud: DevCloud, *, cluster_id: str | None = None, kinds: Iterable[str] | None = None
) -> list[OwnedResource]:
    """Every resource of `kinds` (default: all) in the cloud, of `cluster_id` if given."""
    return cloud_resources(cloud, cluster_id, kinds)


def by_owner(resources: Iterable[OwnedResource]) -> Counter[str]:
    """owner-uid -> how many resources carry it (more than one: a duplicate)."""
    return Counter(r.owner_uid for r in resources)
