"""The aws-like cloud profile: a proxy in front of moto's server that answers like AWS.

moto finishes everything inside the call, never throttles and never refuses a name. Clients
pointed here (the operator, unmodified, or boto3 in a test) see instead what AWS shows:

- RDS: `creating` then `backing-up` before `available`; `modifying` with the new values in
  PendingModifiedValues and the old ones still current until applied
  (`resetting-master-credentials` for a password alone); `storage-optimization` after a
  storage change, and no further storage change for a while; `deleting` before
  DBInstanceNotFound, the identifier refused meanwhile; snapshots `creating` before `available`;
  ModifyDBInstance refused (InvalidDBInstanceState) while the instance is busy.
- SQS: QueueDeletedRecently for a name deleted less than 60 s ago; GetQueueAttributes shows the
  old values for a while after SetQueueAttributes.
- S3: a deleted bucket's name refused with OperationAborted (409) for a while.
- Throttling: token buckets per account, region, service and action, answered with AWS's own
  code and status for each service.
- STS: AssumeRole refused (AccessDenied, 403) unless the role exists in IAM of its account and,
  when its trust policy asks for an sts:ExternalId, the call gives that one (moto lets anyone
  assume any role, existing or not).

What moto stores is never changed: the proxy only delays and reshapes what a client sees. The
durations and rates live in provisioner_dev/profiles/aws-like.yaml (each with its source);
durations are divided by the time scale, rates are not.

    python -m provisioner_dev.awslike --upstream http://127.0.0.1:5000 --port 5002 \\
        --time-scale 300 --duration rds.create=60 --throttle rds.*=20:2

Control, on the same port: GET /__profile__/stats (calls, throttles and refusals per
action; per throttling bucket the calls it let through; the durations drawn), GET
/__profile__/config (the effective profile), POST /__profile__/reset (counters).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from provisioner_dev.cloudprofile import (
    BucketSpec,
    Profile,
    ProfileError,
    add_profile_arguments,
    load_profile,
    names_help,
)
from provisioner_dev.faultproxy import classify_request
from provisioner_dev.processes import LoopbackService, free_port, wait_until

CONTROL = "/__profile__/"


# ---------------------------------------------------------------------------------------------
# Cloud behaviour, in plain objects with an injected clock.


class TokenBucket:
    def __init__(self, spec: BucketSpec, now: float) -> None:
        self.spec = spec
        self.tokens = spec.burst
        self.updated = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.spec.burst, self.tokens + (now - self.updated) * self.spec.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Throttler:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.buckets: dict[tuple[str, ...], TokenBucket] = {}
        # Per bucket (same key): calls it let through, calls it refused (since the last reset).
        self.passed: Counter[tuple[str, ...]] = Counter()
        self.refused: Counter[tuple[str, ...]] = Counter()

    def allow(self, account: str, region: str, service: str, action: str, scope: str) -> bool:
        throttling = self.profile.throttling.get(service)
        if throttling is None:
            return True
        found = throttling.bucket_for(action)
        if found is None:
            return True
        name, spec = found
        key = (account, region, service, scope if throttling.per == "bucket" else "", name)
        now = time.monotonic()
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(spec, now)
        allowed = bucket.take(now)
        (self.passed if allowed else self.refused)[key] += 1
        return allowed

    def by_bucket(self) -> dict[str, dict[str, Any]]:
        """`service.bucket` -> its size and rate, how many buckets of it were used (one per
        account and region; S3: per S3 bucket too), and the calls the busiest one let
        through (`calls`): the figure that bounds how fast those calls can be made,
        (calls - burst) / rate seconds at the least."""
        found: dict[str, dict[str, Any]] = {}
        for key in set(self.passed) | set(self.refused):
            service, name = key[2], key[4]
            spec = self.buckets[key].spec
            row = found.setdefault(
                f"{service}.{name}",
                {
                    "burst": spec.burst,
                    "rate": spec.rate,
                    "per": self.profile.throttling[service].per,
                    "instances": 0,
                    "calls": 0,
                    "calls_total": 0,
                    "throttled": 0,
                },
            )
            row["instances"] += 1
            row["calls"] = max(row["calls"], self.passed[key])
            row["calls_total"] += self.passed[key]
            row["throttled"] += self.refused[key]
        return dict(sorted(found.items()))

    def reset(self) -> None:
        self.passed.clear()
        self.refused.clear()


class Durations:
    """Draws durations from the profile and keeps, per name, how many, the longest, the sum
    (real seconds, after the time scale)."""

    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.count: Counter[str] = Counter()
        self.longest: dict[str, float] = {}
        self.shortest: dict[str, float] = {}
        self.total: dict[str, float] = {}

    def draw(self, name: str) -> float:
        value = self.profile.draw(name, self.rng)
        self.count[name] += 1
        self.longest[name] = max(self.longest.get(name, 0.0), value)
        self.shortest[name] = min(self.shortest.get(name, value), value)
        self.total[name] = self.total.get(name, 0.0) + value
        return value

    def stats(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "count": n,
                "max_s": round(self.longest[name], 3),
                "min_s": round(self.shortest[name], 3),
                "mean_s": round(self.total[name] / n, 3),
            }
            for name, n in sorted(self.count.items())
        }

    def reset(self) -> None:
        self.count.clear()
        self.longest.clear()
        self.shortest.clear()
        self.total.clear()


RDS_NS = "http://rds.amazonaws.com/doc/2014-10-31/"
ET.register_namespace("", RDS_NS)


def _xml(data: str | bytes) -> ET.Element:
    """Parse XML that moto's server (on loopback) or this proxy wrote."""
    return ET.fromstring(data)  # noqa: S314 - our own upstream's answers, not foreign input


def _q(tag: str) -> str:
    return f"{{{RDS_NS}}}{tag}"


# ModifyDBInstance parameter -> (DescribeDBInstances element, PendingModifiedValues element).
MODIFIABLE = {
    "DBInstanceClass": ("DBInstanceClass", "DBInstanceClass"),
    "AllocatedStorage": ("AllocatedStorage", "AllocatedStorage"),
    "EngineVersion": ("EngineVersion", "EngineVersion"),
    "DBPortNumber": ("Port", "Port"),
    "MultiAZ": ("MultiAZ", "MultiAZ"),
    "BackupRetentionPeriod": ("BackupRetentionPeriod", "BackupRetentionPeriod"),
}
BUSY = {"creating", "modifying", "resetting-master-credentials", "deleting"}


def _current_value(element: ET.Element, tag: str) -> str | None:
    if tag == "Port":
        found = element.find(f"{_q('Endpoint')}/{_q('Port')}")
    else:
        found = element.find(_q(tag))
    return None if found is None else (found.text or "")


def _set_value(element: ET.Element, tag: str, value: str) -> None:
    found = (
        element.find(f"{_q('Endpoint')}/{_q('Port')}") if tag == "Port" else element.find(_q(tag))
    )
    if found is not None:
        found.text = value


@dataclass
class Modification:
    until: float
    status: str
    old: dict[str, str]  # element -> value still shown as current
    pending: dict[str, str]  # PendingModifiedValues element -> new value


@dataclass
class DbInstance:
    create_done: float = 0.0
    backup_done: float = 0.0
    modification: Modification | None = None
    storage_optimized: float = 0.0
    storage_locked: float = 0.0


@dataclass
class DeletingDb:
    until: float
    element: str  # the instance's last DBInstance element, serialised


class RdsModel:
    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.instances: dict[tuple[str, str, str], DbInstance] = {}
        self.deleting: dict[tuple[str, str, str], DeletingDb] = {}
        self.snapshots: dict[tuple[str, str, str], tuple[float, float]] = {}
        self.durations = Durations(profile, rng)

    def draw(self, name: str) -> float:
        return self.durations.draw(name)

    def phase(self, key: tuple[str, str, str], now: float) -> str:
        if key in self.deleting and now < self.deleting[key].until:
            return "deleting"
        db = self.instances.get(key)
        if db is None:
            return "available"
        if now < db.create_done:
            return "creating"
        if now < db.backup_done:
            return "backing-up"
        if db.modification is not None and now < db.modification.until:
            return db.modification.status
        if now < db.storage_optimized:
            return "storage-optimization"
        return "available"

    def created(self, key: tuple[str, str, str], now: float) -> None:
        self.deleting.pop(key, None)
        create_done = now + self.draw("rds.create")
        self.instances[key] = DbInstance(
            create_done=create_done, backup_done=create_done + self.draw("rds.backup")
        )

    def storage_locked(self, key: tuple[str, str, str], now: float) -> bool:
        db = self.instances.get(key)
        return db is not None and now < db.storage_locked

    def modified(
        self, key: tuple[str, str, str], params: dict[str, str], before: ET.Element, now: float
    ) -> None:
        old, pending = {}, {}
        for param, (tag, pending_tag) in MODIFIABLE.items():
            if param not in params:
                continue
            was = _current_value(before, tag)
            if was is not None and was.lower() != params[param].lower():
                old[tag] = was
                pending[pending_tag] = params[param]
        password = "MasterUserPassword" in params
        if password:
            pending["MasterUserPassword"] = "****"
        if not pending:
            return
        alone = password and len(pending) == 1
        until = now + self.draw("rds.reset_password" if alone else "rds.modify")
        db = self.instances.setdefault(key, DbInstance())
        status = "resetting-master-credentials" if alone else "modifying"
        db.modification = Modification(until=until, status=status, old=old, pending=pending)
        if "AllocatedStorage" in old:
            db.storage_optimized = until + self.draw("rds.storage_optimization")
            db.storage_locked = max(now + self.draw("rds.storage_cooldown"), db.storage_optimized)

    def deleted(
        self, key: tuple[str, str, str], before: ET.Element, snapshot: str | None, now: float
    ) -> None:
        ready = now
        if snapshot:
            ready = now + self.draw("rds.snapshot")
            self.snapshots[(key[0], key[1], snapshot)] = (now, ready)
        self.instances.pop(key, None)
        status = before.find(_q("DBInstanceStatus"))
        if status is not None:
            status.text = "deleting"
        self.deleting[key] = DeletingDb(
            until=ready + self.draw("rds.delete"), element=ET.tostring(before, encoding="unicode")
        )

    def snapshot_started(self, key: tuple[str, str, str], now: float) -> None:
        self.snapshots[key] = (now, now + self.draw("rds.snapshot"))

    def render(self, element: ET.Element, account: str, region: str, now: float) -> None:
        """Reshape one DBInstance element of moto's into what AWS shows now."""
        ident = element.findtext(_q("DBInstanceIdentifier")) or ""
        status = element.find(_q("DBInstanceStatus"))
        if status is None or status.text != "available":
            return  # moto's own states (stopped, deleting) are shown as they are
        key = (account, region, ident)
        phase = self.phase(key, now)
        status.text = phase
        if phase == "creating":
            endpoint = element.find(_q("Endpoint"))
            if endpoint is not None:
                element.remove(endpoint)  # AWS has no endpoint before the instance exists
        db = self.instances.get(key)
        if db is None or db.modification is None or phase != db.modification.status:
            return
        for tag, value in db.modification.old.items():
            _set_value(element, tag, value)
        pending = element.find(_q("PendingModifiedValues"))
        if pending is None:
            pending = ET.SubElement(element, _q("PendingModifiedValues"))
        for tag, value in db.modification.pending.items():
            ET.SubElement(pending, _q(tag)).text = value

    def deleting_elements(self, account: str, region: str, now: float) -> list[ET.Element]:
        return [
            _xml(d.element)
            for (acct, reg, _), d in sorted(self.deleting.items())
            if acct == account and reg == region and now < d.until
        ]

    def render_snapshot(self, element: ET.Element, account: str, region: str, now: float) -> None:
        ident = element.findtext(_q("DBSnapshotIdentifier")) or ""
        window = self.snapshots.get((account, region, ident))
        status = element.find(_q("Status"))
        if window is None or status is None or status.text != "available" or now >= window[1]:
            return
        status.text = "creating"
        started, ready = window
        progress = element.find(_q("PercentProgress"))
        if progress is None:
            progress = ET.SubElement(element, _q("PercentProgress"))
        progress.text = str(int(100 * (now - started) / max(ready - started, 1e-9)))


class SqsModel:
    RETENTION = "MessageRetentionPeriod"

    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.deleted: dict[tuple[str, str, str], float] = {}
        self.durations = Durations(profile, rng)
        # queue -> attribute -> (old value or None, shown until)
        self.stale: dict[tuple[str, str, str], dict[str, tuple[str | None, float]]] = {}

    def name_held(self, key: tuple[str, str, str], now: float) -> bool:
        return now < self.deleted.get(key, 0.0)

    def queue_deleted(self, key: tuple[str, str, str], now: float) -> None:
        self.deleted[key] = now + self.durations.draw("sqs.deleted_name")
        self.stale.pop(key, None)

    def attributes_set(
        self, key: tuple[str, str, str], before: dict[str, str], new: dict[str, str], now: float
    ) -> None:
        for attr, value in new.items():
            if before.get(attr) == value:
                continue
            name = "sqs.retention" if attr == self.RETENTION else "sqs.attributes"
            until = now + self.durations.draw(name)
            self.stale.setdefault(key, {})[attr] = (before.get(attr), until)

    def render(
        self, key: tuple[str, str, str], attributes: dict[str, str], asked: list[str], now: float
    ) -> None:
        for attr, (old, until) in self.stale.get(key, {}).items():
            if now >= until or not ({"All", attr} & set(asked)):
                continue
            if old is None:
                attributes.pop(attr, None)
            else:
                attributes[attr] = old


class S3Model:
    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.deleted: dict[str, float] = {}
        self.durations = Durations(profile, rng)

    def name_held(self, bucket: str, now: float) -> bool:
        return now < self.deleted.get(bucket, 0.0)

    def bucket_deleted(self, bucket: str, now: float) -> None:
        self.deleted[bucket] = now + self.durations.draw("s3.deleted_name")


# ---------------------------------------------------------------------------------------------
# The HTTP side.


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _request_id() -> str:
    return uuid.uuid4().hex


def error_response(
    protocol: str, status: int, code: str, message: str, query_code: str | None = None
) -> web.Response:
    """An error the way the service's protocol spells it, for botocore to parse."""
    if protocol == "json":
        body = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": message})
        return web.Response(
            status=status,
            body=body,
            content_type="application/x-amz-json-1.0",
            headers={
                "x-amzn-query-error": f"{query_code or code};Sender",
                "x-amzn-RequestId": _request_id(),
            },
        )
    if protocol == "query":
        body = (
            f'<ErrorResponse xmlns="{RDS_NS}"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error>"
            f"<RequestId>{_request_id()}</RequestId></ErrorResponse>"
        )
        return web.Response(status=status, body=body, content_type="text/xml")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{_request_id()}</RequestId><HostId>{_request_id()}</HostId></Error>"
    )
    return web.Response(status=status, body=body, content_type="application/xml")


AUTH = re.compile(r"Credential=([^/,\s]+)/[^/]+/([^/]+)/([^/]+)/")


@dataclass
class Upstream:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class AwsLike:
    """The proxy's state: profile, cloud models, counters."""

    upstream: str
    profile: Profile
    seed: int | None = None
    clock: Callable[[], float] = time.monotonic
    counts: Counter[str] = field(default_factory=Counter)
    throttled: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    accounts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.throttler = Throttler(self.profile)
        self.rds = RdsModel(self.profile, self.rng)
        self.sqs = SqsModel(self.profile, self.rng)
        self.s3 = S3Model(self.profile, self.rng)

    def stats(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "time_scale": self.profile.time_scale,
            "calls": sum(self.counts.values()),
            "throttles": sum(self.throttled.values()),
            "refusals": sum(self.refused.values()),
            "calls_by_action": dict(self.counts),
            "throttles_by_action": dict(self.throttled),
            "refusals_by_action": dict(self.refused),
            "accounts": dict(self.accounts),
            "buckets": self.throttler.by_bucket(),
            "durations_drawn": {
                **self.rds.durations.stats(),
                **self.sqs.durations.stats(),
                **self.s3.durations.stats(),
            },
        }

    def reset(self) -> None:
        """The counters start again (the buckets and the resources' states do not)."""
        self.counts.clear()
        self.throttled.clear()
        self.refused.clear()
        self.throttler.reset()
        for model in (self.rds, self.sqs, self.s3):
            model.durations.reset()


def make_app(state: AwsLike) -> web.Application:
    session: dict[str, ClientSession] = {}

    async def on_startup(app: web.Application) -> None:
        session["s"] = ClientSession(timeout=ClientTimeout(total=60), auto_decompress=False)

    async def on_cleanup(app: web.Application) -> None:
        await session["s"].close()

    async def send(method: str, path_qs: str, headers: dict[str, str], body: bytes) -> Upstream:
        url = state.upstream.rstrip("/") + path_qs
        async with session["s"].request(
            method, url, headers=headers, data=body, allow_redirects=False
        ) as answer:
            payload = await answer.read()
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            return Upstream(answer.status, kept, payload)

    def forwarded_headers(request: web.Request) -> dict[str, str]:
        # Host is kept: moto builds queue URLs from it, and they must name this proxy.
        return {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection")
        }

    async def account_of(request: web.Request, access_key: str) -> str:
        """The account moto files this access key under (its STS answer), cached."""
        if "x-moto-account-id" in request.headers:
            return request.headers["x-moto-account-id"]
        if not access_key:
            return "anonymous"
        known = state.accounts.get(access_key)
        if known:
            return known
        auth = (
            f"AWS4-HMAC-SHA256 Credential={access_key}/20200101/us-east-1/sts/aws4_request, "
            "SignedHeaders=host, Signature=0"
        )
        try:
            answer = await send(
                "POST",
                "/",
                {"Authorization": auth, "Content-Type": "application/x-www-form-urlencoded"},
                b"Action=GetCallerIdentity&Version=2011-06-15",
            )
            match = re.search(rb"<Account>(\d+)</Account>", answer.body)
        except OSError:
            match = None
        if match is None:
            return f"key:{access_key}"
        state.accounts[access_key] = match.group(1).decode()
        return state.accounts[access_key]

    async def rds_describe(headers: dict[str, str], ident: str) -> ET.Element | None:
        body = urllib.parse.urlencode(
            {
                "Action": "DescribeDBInstances",
                "Version": "2014-10-31",
                "DBInstanceIdentifier": ident,
            }
        ).encode()
        internal = {
            "Authorization": headers.get("Authorization", ""),
            "Content-Type": "application/x-www-form-urlencoded",
        }
        answer = await send("POST", "/", internal, body)
        if answer.status != 200:
            return None
        return _xml(answer.body).find(f".//{_q('DBInstance')}")

    async def assume_role_refusal(body: bytes, access_key: str) -> str | None:
        """Why AWS would refuse this AssumeRole (the role missing from its account's IAM, or
        another ExternalId than its trust policy asks for); None when it would not."""
        params = dict(urllib.parse.parse_qsl(body.decode()))
        role_arn = params.get("RoleArn", "")
        match = re.match(r"^arn:aws[\w-]*:iam::(\d{12}):role/(?:.*/)?([^/]+)$", role_arn)
        caller = f"arn:aws:iam::{state.accounts.get(access_key, '123456789012')}:user/operator"
        denied = (
            f"User: {caller} is not authorized to perform: sts:AssumeRole on resource: {role_arn}"
        )
        if match is None:
            return denied
        account, name = match.groups()
        query = urllib.parse.urlencode(
            {"Action": "GetRole", "Version": "2010-05-08", "RoleName": name}
        ).encode()
        auth = (
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20200101/us-east-1/iam/"
            "aws4_request, SignedHeaders=host, Signature=0"
        )
        answer = await send(
            "POST",
            "/",
            {
                "Authorization": auth,
                "Content-Type": "application/x-www-form-urlencoded",
                "x-moto-account-id": account,
            },
            query,
        )
        if answer.status != 200:
            return denied
        found = re.search(
            rb"<AssumeRolePolicyDocument>([^<]*)</AssumeRolePolicyDocument>", answer.body
        )
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

    def xml_answer(answer: Upstream, root: ET.Element) -> web.Response:
        body = ET.tostring(root, encoding="unicode")
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-type"}
        return web.Response(status=200, body=body, content_type="text/xml", headers=headers)

    def plain(answer: Upstream) -> web.Response:
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    async def handle_rds(
        request: web.Request, body: bytes, account: str, region: str, action: str
    ) -> web.StreamResponse:
        params = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}
        ident = params.get("DBInstanceIdentifier", "")
        key = (account, region, ident)
        now = state.clock()
        headers = forwarded_headers(request)
        before = None
        if action == "CreateDBInstance" and state.rds.phase(key, now) == "deleting":
            return refuse(
                "rds", action, "query", 400, "DBInstanceAlreadyExists", "DB instance already exists"
            )
        if action == "ModifyDBInstance":
            if state.rds.phase(key, now) in BUSY:
                return refuse(
                    "rds",
                    action,
                    "query",
                    400,
                    "InvalidDBInstanceState",
                    f"Database instance {ident} is not in available state.",
                )
            before = await rds_describe(headers, ident)
            changes_storage = (
                before is not None
                and "AllocatedStorage" in params
                and _current_value(before, "AllocatedStorage") != params["AllocatedStorage"]
            )
            if changes_storage and state.rds.storage_locked(key, now):
                return refuse(
                    "rds",
                    action,
                    "query",
                    400,
                    "InvalidParameterCombination",
                    "You cannot currently modify the storage of this DB instance because the "
                    "previous storage change is being optimized.",
                )
        if action == "DeleteDBInstance":
            before = await rds_describe(headers, ident)
        answer = await send(request.method, request.rel_url.raw_path_qs, headers, body)
        now = state.clock()
        if answer.status == 404 and action == "DescribeDBInstances":
            deleting = state.rds.deleting.get(key)
            if deleting is not None and now < deleting.until:
                root = ET.Element(_q("DescribeDBInstancesResponse"))
                listing = ET.SubElement(
                    ET.SubElement(root, _q("DescribeDBInstancesResult")), _q("DBInstances")
                )
                listing.append(_xml(deleting.element))
                meta = ET.SubElement(root, _q("ResponseMetadata"))
                ET.SubElement(meta, _q("RequestId")).text = _request_id()
                return xml_answer(answer, root)
        if answer.status != 200:
            return plain(answer)
        if action == "CreateDBInstance":
            state.rds.created(key, now)
        elif action == "ModifyDBInstance" and before is not None:
            state.rds.modified(key, params, before, now)
        elif action == "DeleteDBInstance" and before is not None:
            skip = params.get("SkipFinalSnapshot", "false").lower() == "true"
            snapshot = None if skip else params.get("FinalDBSnapshotIdentifier")
            state.rds.deleted(key, before, snapshot, now)
        elif action == "CreateDBSnapshot":
            state.rds.snapshot_started(
                (account, region, params.get("DBSnapshotIdentifier", "")), now
            )
        if action not in (
            "CreateDBInstance",
            "ModifyDBInstance",
            "DescribeDBInstances",
            "DescribeDBSnapshots",
            "CreateDBSnapshot",
        ):
            return plain(answer)
        root = _xml(answer.body)
        for element in root.iter(_q("DBInstance")):
            state.rds.render(element, account, region, now)
        for element in root.iter(_q("DBSnapshot")):
            state.rds.render_snapshot(element, account, region, now)
        if action == "DescribeDBInstances" and not ident:
            instances = root.find(f".//{_q('DBInstances')}")
            if instances is not None:
                for element in state.rds.deleting_elements(account, region, now):
                    instances.append(element)
        return xml_answer(answer, root)

    def queue_key(account: str, region: str, url: str) -> tuple[str, str, str]:
        parts = [p for p in urllib.parse.urlparse(url).path.split("/") if p]
        if len(parts) >= 2:
            return parts[-2], region, parts[-1]
        return account, region, parts[-1] if parts else ""

    async def handle_sqs(
        request: web.Request, body: bytes, account: str, region: str, action: str
    ) -> web.StreamResponse:
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            params = {}
        now = state.clock()
        headers = forwarded_headers(request)
        if action == "CreateQueue":
            key = (account, region, str(params.get("QueueName", "")))
            if state.sqs.name_held(key, now):
                return refuse(
                    "sqs",
                    action,
                    "json",
                    400,
                    "QueueDeletedRecently",
                    "You must wait 60 seconds after deleting a queue before you can create "
                    "another queue with the same name.",
                    query_code="AWS.SimpleQueueService.QueueDeletedRecently",
                )
        key = queue_key(account, region, str(params.get("QueueUrl", "")))
        before: dict[str, str] | None = None
        if action == "SetQueueAttributes":
            internal = dict(headers, **{"X-Amz-Target": "AmazonSQS.GetQueueAttributes"})
            query = json.dumps({"QueueUrl": params.get("QueueUrl"), "AttributeNames": ["All"]})
            current = await send("POST", "/", internal, query.encode())
            if current.status == 200:
                before = json.loads(current.body).get("Attributes") or {}
        answer = await send(request.method, request.rel_url.raw_path_qs, headers, body)
        if answer.status != 200:
            return plain(answer)
        now = state.clock()
        if action == "DeleteQueue":
            state.sqs.queue_deleted(key, now)
        elif action == "SetQueueAttributes" and before is not None:
            state.sqs.attributes_set(key, before, dict(params.get("Attributes") or {}), now)
        elif action == "GetQueueAttributes" and state.sqs.stale.get(key):
            payload = json.loads(answer.body)
            attributes = payload.setdefault("Attributes", {})
            state.sqs.render(key, attributes, list(params.get("AttributeNames") or []), now)
            return web.Response(
                status=200,
                body=json.dumps(payload),
                headers={k: v for k, v in answer.headers.items() if k.lower() != "content-length"},
            )
        return plain(answer)

    async def handle_s3(request: web.Request, body: bytes) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        bucket_level = len(parts) == 1 and not request.query
        now = state.clock()
        if bucket_level and request.method == "PUT" and state.s3.name_held(parts[0], now):
            return refuse(
                "s3",
                "CreateBucket",
                "rest-xml",
                409,
                "OperationAborted",
                "A conflicting conditional operation is currently in progress against this "
                "resource. Please try again.",
            )
        answer = await send(
            request.method, request.rel_url.raw_path_qs, forwarded_headers(request), body
        )
        if bucket_level and request.method == "DELETE" and answer.status == 204:
            state.s3.bucket_deleted(parts[0], state.clock())
        return plain(answer)

    def refuse(
        service: str,
        action: str,
        protocol: str,
        status: int,
        code: str,
        message: str,
        query_code: str | None = None,
    ) -> web.Response:
        state.refused[f"{service}.{action}.{code}"] += 1
        return error_response(protocol, status, code, message, query_code)

    async def control(request: web.Request) -> web.Response:
        action = request.path[len(CONTROL) :]
        if action == "stats":
            return web.json_response(state.stats())
        if action == "config":
            return web.json_response(state.profile.describe())
        if action == "reset" and request.method == "POST":
            state.reset()
            return web.json_response({"ok": True})
        return web.json_response({"error": f"unknown control {action!r}"}, status=404)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.startswith(CONTROL):
            return await control(request)
        body = await request.read()
        service, operation, protocol = classify_request(request, body)
        match = AUTH.search(request.headers.get("Authorization", ""))
        access_key, region = (match.group(1), match.group(2)) if match else ("", "us-east-1")
        account = await account_of(request, access_key)
        label = f"{service}.{operation}"
        state.counts[label] += 1
        action = request.method if service == "s3" else operation
        scope = next((p for p in request.path.split("/") if p), "")
        if not state.throttler.allow(account, region, service, action, scope):
            state.throttled[label] += 1
            throttling = state.profile.throttling[service]
            return error_response(protocol, throttling.status, throttling.code, "Rate exceeded")
        if service == "rds" and protocol == "query":
            return await handle_rds(request, body, account, region, operation)
        if service == "sqs" and protocol == "json":
            return await handle_sqs(request, body, account, region, operation)
        if service == "s3":
            return await handle_s3(request, body)
        if service == "sts" and operation == "AssumeRole":
            refused = await assume_role_refusal(body, access_key)
            if refused is not None:
                return refuse("sts", "AssumeRole", "query", 403, "AccessDenied", refused)
        answer = await send(
            request.method, request.rel_url.raw_path_qs, forwarded_headers(request), body
        )
        return plain(answer)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


# ---------------------------------------------------------------------------------------------
# Command line and launcher.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="provisioner_dev.awslike", description=__doc__, epilog=names_help()
    )
    parser.add_argument("--upstream", required=True, help="moto's server URL")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--profile", default="aws-like")
    parser.add_argument("--seed", type=int, help="seed of the duration draws")
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.profile, args.time_scale, args.duration, args.throttle)
    except ProfileError as exc:
        print(f"provisioner_dev.awslike: {exc}", file=sys.stderr)
        return 2
    state = AwsLike(upstream=args.upstream, profile=profile, seed=args.seed)
    web.run_app(
        make_app(state),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        shutdown_timeout=1.0,
    )
    return 0


def _get_json(url: str, method: str = "GET") -> dict[str, Any]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback only
        return json.loads(answer.read())


@dataclass(kw_only=True)
class AwsLikeProxy(LoopbackService):
    """provisioner_dev.awslike as a child process in front of an upstream (moto's server).

    `args` are profile arguments (see profile_args); the profile is validated here first,
    so a bad value fails in the caller with a ProfileError, not in a child's log.
    """

    upstream: str
    profile: str = "aws-like"
    args: list[str] = field(default_factory=list)
    seed: int | None = None

    def start(self, timeout: float = 30.0) -> None:
        parser = argparse.ArgumentParser()
        add_profile_arguments(parser)
        parsed = parser.parse_args(self.args)
        load_profile(self.profile, parsed.time_scale, parsed.duration, parsed.throttle)
        self.port = self.port or free_port()
        command = [
            sys.executable,
            "-m",
            "provisioner_dev.awslike",
            f"--upstream={self.upstream}",
            f"--port={self.port}",
            f"--profile={self.profile}",
            *self.args,
        ]
        if self.seed is not None:
            command.append(f"--seed={self.seed}")
        self.launch(command, self._ready, what="aws-like proxy", timeout=timeout)

    def _ready(self) -> bool:
        self.stats()
        return True

    def stats(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}stats")

    def config(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}config")

    def reset(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}reset", method="POST")

    def wait_for(self, check: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict:
        """Poll stats until `check(stats)` holds; the stats that satisfied it."""
        seen: dict[str, Any] = {}

        def ready() -> bool:
            seen.update(self.stats())
            return check(seen)

        wait_until(ready, timeout=timeout, what="aws-like proxy stats", interval=0.05)
        return seen


if __name__ == "__main__":
    raise SystemExit(main())
