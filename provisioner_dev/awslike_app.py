"""The aws-like proxy's app: its state (profile, cloud models, counters), the dispatch of each
call to its service's behaviour after throttling, and the control endpoints."""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from provisioner_dev.awslike_http import Call, Upstream, error_response, plain
from provisioner_dev.awslike_rds import RdsModel, handle_rds
from provisioner_dev.awslike_s3 import S3Model, handle_s3
from provisioner_dev.awslike_sqs import SqsModel, handle_sqs
from provisioner_dev.awslike_sts import account_of, assume_role_refusal
from provisioner_dev.awslike_throttling import Throttler
from provisioner_dev.cloudprofile import Profile
from provisioner_dev.faultproxy import classify_request

CONTROL = "/__profile__/"
AUTH = re.compile(r"Credential=([^/,\s]+)/[^/]+/([^/]+)/([^/]+)/")


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


class AwsLikeApp:
    """The proxy's handlers over its state: every call counted, throttled, then answered by
    its service's behaviour (or moto's answer as it is)."""

    def __init__(self, state: AwsLike) -> None:
        self.state = state
        self.upstream = Upstream(state.upstream)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith(CONTROL):
            return await self.control(request)
        state = self.state
        body = await request.read()
        service, operation, protocol = classify_request(request, body)
        match = AUTH.search(request.headers.get("Authorization", ""))
        access_key, region = (match.group(1), match.group(2)) if match else ("", "us-east-1")
        account = await account_of(self.upstream, state.accounts, request, access_key)
        label = f"{service}.{operation}"
        state.counts[label] += 1
        action = request.method if service == "s3" else operation
        scope = next((p for p in request.path.split("/") if p), "")
        if not state.throttler.allow(account, region, service, action, scope):
            state.throttled[label] += 1
            throttling = state.profile.throttling[service]
            return error_response(protocol, throttling.status, throttling.code, "Rate exceeded")
        call = Call(
            request, body, account, region, operation, self.upstream, state.clock, state.refused
        )
        if service == "rds" and protocol == "query":
            return await handle_rds(state.rds, call)
        if service == "sqs" and protocol == "json":
            return await handle_sqs(state.sqs, call)
        if service == "s3":
            return await handle_s3(state.s3, call)
        if service == "sts" and operation == "AssumeRole":
            refused = await assume_role_refusal(self.upstream, state.accounts, body, access_key)
            if refused is not None:
                return call.refuse("sts", "AssumeRole", "query", 403, "AccessDenied", refused)
        return plain(await call.forward())

    async def control(self, request: web.Request) -> web.Response:
        action = request.path[len(CONTROL) :]
        if action == "stats":
            return web.json_response(self.state.stats())
        if action == "config":
            return web.json_response(self.state.profile.describe())
        if action == "reset" and request.method == "POST":
            self.state.reset()
            return web.json_response({"ok": True})
        return web.json_response({"error": f"unknown control {action!r}"}, status=404)


def make_app(state: AwsLike) -> web.Application:
    proxy = AwsLikeApp(state)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    app.on_startup.append(proxy.upstream.open)
    app.on_cleanup.append(proxy.upstream.close)
    return app
