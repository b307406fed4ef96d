"""The aws-like proxy's HTTP side: moto's server behind it, a client's call, and answers and
errors the way each AWS protocol spells them (for botocore to parse)."""

from __future__ import annotations

import json
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import ClientSession, ClientTimeout, web

# RDS's query API: its answers are in this namespace, and so is every query-protocol error here.
RDS_NS = "http://rds.amazonaws.com/doc/2014-10-31/"
ET.register_namespace("", RDS_NS)

# Hop-by-hop and length headers: aiohttp sets its own on each side.
UNFORWARDED = ("content-length", "transfer-encoding", "connection")


def request_id() -> str:
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
                "x-amzn-RequestId": request_id(),
            },
        )
    if protocol == "query":
        body = (
            f'<ErrorResponse xmlns="{RDS_NS}"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error>"
            f"<RequestId>{request_id()}</RequestId></ErrorResponse>"
        )
        return web.Response(status=status, body=body, content_type="text/xml")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id()}</RequestId><HostId>{request_id()}</HostId></Error>"
    )
    return web.Response(status=status, body=body, content_type="application/xml")


@dataclass
class Answer:
    """What moto's server answered."""

    status: int
    headers: dict[str, str]
    body: bytes


def plain(answer: Answer) -> web.Response:
    """moto's answer as it is."""
    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


def xml_answer(answer: Answer, root: ET.Element) -> web.Response:
    """moto's answer with its XML document replaced by `root`."""
    body = ET.tostring(root, encoding="unicode")
    headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-type"}
    return web.Response(status=200, body=body, content_type="text/xml", headers=headers)


def forwarded_headers(request: web.Request) -> dict[str, str]:
    # Host is kept: moto builds queue URLs from it, and they must name this proxy.
    return {k: v for k, v in request.headers.items() if k.lower() not in UNFORWARDED}


class Upstream:
    """moto's server, through one HTTP session opened and closed with the proxy's app."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: ClientSession | None = None

    async def open(self, app: web.Application) -> None:
        self.session = ClientSession(timeout=ClientTimeout(total=60), auto_decompress=False)

    async def close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def send(self, method: str, path_qs: str, headers: dict[str, str], body: bytes) -> Answer:
        assert self.session is not None, "the app has not started"
        url = self.url.rstrip("/") + path_qs
        async with self.session.request(
            method, url, headers=headers, data=body, allow_redirects=False
        ) as answer:
            payload = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in UNFORWARDED}
            return Answer(answer.status, kept, payload)


@dataclass
class Call:
    """One client call to a service, as the proxy answers it: what was asked and by whom, and
    what the answer is made with (moto behind, the clock the cloud's states are timed by, the
    counts of the calls refused the way AWS would refuse them)."""

    request: web.Request
    body: bytes
    account: str
    region: str
    action: str
    upstream: Upstream
    clock: Callable[[], float]
    refused: Counter[str]

    async def forward(self, headers: dict[str, str] | None = None) -> Answer:
        """moto's answer to the call as the client made it."""
        if headers is None:
            headers = forwarded_headers(self.request)
        return await self.upstream.send(
            self.request.method, self.request.rel_url.raw_path_qs, headers, self.body
        )

    def refuse(
        self,
        service: str,
        action: str,
        protocol: str,
        status: int,
        code: str,
        message: str,
        query_code: str | None = None,
    ) -> web.Response:
        """AWS's refusal, never shown to moto; counted as `service.action.code`."""
        self.refused[f"{service}.{action}.{code}"] += 1
        return error_response(protocol, status, code, message, query_code)
