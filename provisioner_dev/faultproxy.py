"""A fault-injecting HTTP proxy for the AWS endpoint, on loopback.

The operator runs unmodified with its endpoint URL pointed here. For each request the
proxy, at the configured rate, answers for the cloud with a throttling error, a 500 or
503, a slow response, or a dropped connection; everything else is forwarded to the
upstream (moto's server). It counts every request by service, operation and outcome.

    python -m provisioner_dev.faultproxy --upstream http://127.0.0.1:5000 --port 5001 --rate 0.3

Control, on the same port: GET /__proxy__/stats, POST /__proxy__/config {"rate": 0.1},
POST /__proxy__/reset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, web

# drop: the connection dies before the cloud sees the request; lost: the cloud acts on
# it, then the connection dies before the answer (the case that breeds duplicates).
FAULTS = ("throttle", "error500", "error503", "slow", "drop", "lost")
CONTROL = "/__proxy__/"


@dataclass
class ProxyState:
    upstream: str
    rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    slow_seconds: float = 1.5
    seed: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=random.Random)

    def stats(self) -> dict[str, object]:
        by_outcome: Counter[str] = Counter()
        by_service: Counter[str] = Counter()
        for key, n in self.counts.items():
            service, _op, outcome = key.split("|")
            by_outcome[outcome] += n
            by_service[service] += n
        return {
            "rate": self.rate,
            "total": sum(self.counts.values()),
            "forwarded": sum(by_outcome.get(o, 0) for o in ("forwarded", "slow", "lost")),
            "injected": sum(n for o, n in by_outcome.items() if o != "forwarded"),
            "by_outcome": dict(by_outcome),
            "by_service": dict(by_service),
            "by_operation": dict(self.counts),
        }


def classify_request(request: web.Request, body: bytes) -> tuple[str, str, str]:
    """(service, operation, protocol) of an AWS request, from what the SDK sends."""
    target = request.headers.get("X-Amz-Target", "")
    auth = request.headers.get("Authorization", "")
    match = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", auth)
    service = match.group(1) if match else "unknown"
    if target:
        return service, target.split(".")[-1], "json"
    if request.content_type == "application/x-www-form-urlencoded" and body:
        params = urllib.parse.parse_qs(body.decode(errors="replace"))
        action = (params.get("Action") or ["unknown"])[0]
        return service, action, "query"
    subresource = ",".join(sorted(request.query)) if request.query else ""
    return (
        service,
        f"{request.method} ?{subresource}" if subresource else request.method,
        "rest-xml",
    )


def error_response(protocol: str, status: int, code: str, message: str) -> web.Response:
    if protocol == "json":
        body = json.dumps({"__type": code, "message": message})
        return web.Response(
            status=status,
            body=body,
            content_type="application/x-amz-json-1.0",
            headers={"x-amzn-query-error": f"{code};Sender"},
        )
    if protocol == "query":
        body = (
            "<ErrorResponse><Error><Type>Sender</Type>"
            f"<Code>{code}</Code><Message>{message}</Message></Error>"
            "<RequestId>fault-proxy</RequestId></ErrorResponse>"
        )
    else:
        body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return web.Response(status=status, body=body, content_type="text/xml")


class FaultProxyApp:
    """The proxy's handlers: each call counted, then a fault injected or the call forwarded."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.session: ClientSession | None = None

    async def open(self, app: web.Application) -> None:
        self.session = ClientSession(timeout=ClientTimeout(total=60), auto_decompress=False)

    async def close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def control(self, request: web.Request) -> web.Response:
        state = self.state
        action = request.path[len(CONTROL) :]
        if action == "stats":
            return web.json_response(state.stats())
        if action == "reset":
            state.counts.clear()
            return web.json_response({"ok": True})
        if action == "config":
            data = await request.json()
            state.rate = float(data.get("rate", state.rate))
            if "faults" in data:
                state.faults = tuple(data["faults"])
            return web.json_response({"rate": state.rate, "faults": list(state.faults)})
        return web.json_response({"error": "unknown"}, status=404)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith(CONTROL):
            return await self.control(request)
        state = self.state
        body = await request.read()
        service, operation, protocol = classify_request(request, body)
        fault = None
        if state.rate > 0 and state.rng.random() < state.rate:
            fault = state.rng.choice(state.faults)
        key = f"{service}|{operation}|{fault or 'forwarded'}"
        state.counts[key] += 1
        injected = self.answer_for(fault, protocol, request)
        if injected is not None:
            return injected
        if fault == "slow":
            await asyncio.sleep(state.slow_seconds)
        return await self.forward(request, body, lost=fault == "lost")

    @staticmethod
    def answer_for(fault: str | None, protocol: str, request: web.Request) -> web.Response | None:
        """The answer a fault gives instead of the cloud's; None when the call goes on."""
        if fault == "throttle":
            code = "SlowDown" if protocol == "rest-xml" else "Throttling"
            status = 503 if protocol == "rest-xml" else 400
            return error_response(protocol, status, code, "Rate exceeded (injected)")
        if fault == "error500":
            return error_response(protocol, 500, "InternalError", "injected internal error")
        if fault == "error503":
            return error_response(protocol, 503, "ServiceUnavailable", "injected unavailability")
        if fault == "drop":
            # The connection dies with no answer, as when a load balancer resets it.
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=502)
        return None

    async def forward(self, request: web.Request, body: bytes, lost: bool) -> web.Response:
        """The upstream's answer; `lost`: the upstream acts on the call, the client never
        hears of it."""
        assert self.session is not None, "the app has not started"
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding", "connection")
        }
        url = self.state.upstream.rstrip("/") + request.rel_url.raw_path_qs
        async with self.session.request(
            request.method, url, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            payload = await upstream.read()
            out_headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower()
                not in ("content-length", "transfer-encoding", "connection", "content-encoding")
            }
            if "Content-Encoding" in upstream.headers:
                out_headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
            if lost and request.transport is not None:
                request.transport.abort()
                return web.Response(status=502)
            return web.Response(status=upstream.status, body=payload, headers=out_headers)


def make_app(state: ProxyState) -> web.Application:
    proxy = FaultProxyApp(state)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    app.on_startup.append(proxy.open)
    app.on_cleanup.append(proxy.close)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provisioner_dev.faultproxy")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--slow-seconds", type=float, default=1.5)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    state = ProxyState(
        upstream=args.upstream,
        rate=args.rate,
        faults=tuple(f for f in args.faults.split(",") if f),
        slow_seconds=args.slow_seconds,
    )
    if args.seed is not None:
        state.rng.seed(args.seed)
    web.run_app(make_app(state), host="127.0.0.1", port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
