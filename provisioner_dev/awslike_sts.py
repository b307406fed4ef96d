"""Accounts in the aws-like cloud: which account moto files an access key under, and
AssumeRole refused (AccessDenied, 403) unless the role exists in IAM of its account and, when
its trust policy asks for an sts:ExternalId, the call gives that one (moto lets anyone assume
any role, existing or not)."""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

from aiohttp import web

from provisioner_dev.awslike_http import Upstream

FORM = "application/x-www-form-urlencoded"
# The access key IAM's GetRole is asked with; x-moto-account-id names the role's account.
IAM_CALLER = "AKIAIOSFODNN7EXAMPLE"
ROLE_ARN = re.compile(r"^arn:aws[\w-]*:iam::(\d{12}):role/(?:.*/)?([^/]+)$")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _signed(access_key: str, service: str) -> str:
    """An Authorization header naming the access key (moto does not check signatures)."""
    return (
        f"AWS4-HMAC-SHA256 Credential={access_key}/20200101/us-east-1/{service}/aws4_request, "
        "SignedHeaders=host, Signature=0"
    )


async def account_of(
    upstream: Upstream, accounts: dict[str, str], request: web.Request, access_key: str
) -> str:
    """The account moto files this access key under (its STS answer), cached in `accounts`."""
    if "x-moto-account-id" in request.headers:
        return request.headers["x-moto-account-id"]
    if not access_key:
        return "anonymous"
    known = accounts.get(access_key)
    if known:
        return known
    try:
        answer = await upstream.send(
            "POST",
            "/",
            {"Authorization": _signed(access_key, "sts"), "Content-Type": FORM},
            b"Action=GetCallerIdentity&Version=2011-06-15",
        )
        match = re.search(rb"<Account>(\d+)</Account>", answer.body)
    except OSError:
        match = None
    if match is None:
        return f"key:{access_key}"
    accounts[access_key] = match.group(1).decode()
    return accounts[access_key]


async def assume_role_refusal(
    upstream: Upstream, accounts: dict[str, str], body: bytes, access_key: str
) -> str | None:
    """Why AWS would refuse this AssumeRole (the role missing from its account's IAM, or
    another ExternalId than its trust policy asks for); None when it would not."""
    params = dict(urllib.parse.parse_qsl(body.decode()))
    role_arn = params.get("RoleArn", "")
    match = ROLE_ARN.match(role_arn)
    caller = f"arn:aws:iam::{accounts.get(access_key, '123456789012')}:user/operator"
    denied = f"User: {caller} is not authorized to perform: sts:AssumeRole on resource: {role_arn}"
    if match is None:
        return denied
    account, name = match.groups()
    query = urllib.parse.urlencode(
        {"Action": "GetRole", "Version": "2010-05-08", "RoleName": name}
    ).encode()
    headers = {
        "Authorization": _signed(IAM_CALLER, "iam"),
        "Content-Type": FORM,
        "x-moto-account-id": account,
    }
    answer = await upstream.send("POST", "/", headers, query)
    if answer.status != 200:
        return denied
    found = re.search(rb"<AssumeRolePolicyDocument>([^<]*)</AssumeRolePolicyDocument>", answer.body)
    if found is None:
        return None
    try:
        policy = json.loads(urllib.parse.unquote(found.group(1).decode()))
    except ValueError:
        return None
    wanted = {
        str(value)
        for statement in policy.get("Statement", [])
        for value in _as_list(
            statement.get("Condition", {}).get("StringEquals", {}).get("sts:ExternalId")
        )
    }
    if wanted and params.get("ExternalId") not in wanted:
        return denied
    return None
