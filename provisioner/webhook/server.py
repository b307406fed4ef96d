"""The conversion webhook: v1alpha1 <-> v1beta1 for the API server, served by the operator.

At start (`prepare`): the CRDs must serve the version the operator watches and convert by
webhook (else one line and exit 2); the certificates are read from (or written to) their
Secret (webhook/certificates.py); the HTTPS server starts on its own port; and each CRD's
`spec.conversion.webhook.clientConfig` is pointed at this operator (the chart's Service in a
cluster, loopback outside one) with the CA in `caBundle`. Every hour the certificates are
checked again, renewed when due and reloaded without a restart.

Requests (`Converter`): a body over `MAX_BODY_BYTES` is answered 413 before it is read (from
its Content-Length) or as soon as the part read passes the cap; a body that is not an
apiextensions.k8s.io/v1 ConversionReview with a request, its uid, desiredAPIVersion and a list
of objects is answered 400 with one line; parsing, converting and encoding run in threads of
the webhook's own, never on the event loop the operator's handlers share.

RBAC: `get` and `patch` on exactly the four CRDs (resourceNames), and `get`/`create`/`update`
of the one Secret in the operator's namespace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from aiohttp import web

from provisioner import GROUP, VERSION
from provisioner.config import Settings
from provisioner.kinds.registry import KINDS
from provisioner.kube.client import Kube, KubeError
from provisioner.model import conversion, schema_defaults
from provisioner.webhook import certificates as webhook_certs

log = logging.getLogger(__name__)
PATH = "/convert"
CHECK_SECONDS = 3600.0
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
T = TypeVar("T")
# The largest request body accepted. The API server sends one ConversionReview per request it
# serves, holding that request's objects: one for a write or a get (etcd refuses objects over
# 1.5 MiB by default, kube-apiserver request bodies over 3 MiB), one page for a paged list
# (kubectl pages by 500). 8 MiB holds a 500-object page of 16 KiB objects; a larger list read
# at v1alpha1 in one response is refused (read it at v1beta1, the stored version, or paged).
# Parsed, a review takes about ten times its size in memory.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Reviews parsed and converted at once. A review over a quarter of the cap is "large": one
# at a time (a review at the cap takes about 90 MiB while it converts), so the other thread
# stays free for the API server's usual one-object reviews. Waiting ones hold only their bytes.
CONVERSION_THREADS = 2
REVIEW_VERSION = "apiextensions.k8s.io/v1"


@dataclass
class Stats:
    """What the metrics show of the webhook: its reviews by result and its certificate."""

    reviews: Counter[str] = field(default_factory=Counter)
    # The serving certificate's notAfter (Unix seconds); None until one is loaded.
    certificate_expiry: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, result: str) -> None:
        with self._lock:
            self.reviews[result] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.reviews)


# The reviews' results: `converted`; `failed` (a ConversionReview whose objects could not be
# converted: a Failure the API server shows to the client); `malformed` (400); `too_large` (413).
REVIEW_RESULTS = ("converted", "failed", "malformed", "too_large")
STATS = Stats()


class CrdError(RuntimeError):
    """The CRDs found cannot be served by this operator; the message is one line."""


def crd_names() -> list[str]:
    return [f"{k.plural}.{GROUP}" for k in KINDS]


def check_crd(crd: dict[str, Any] | None, name: str) -> None:
    """Raises CrdError unless the CRD serves VERSION and converts by webhook."""
    fix = "apply this release's CRDs first (kubectl apply --server-side -f crds/, or helm upgrade)"
    if crd is None:
        raise CrdError(f"CRD {name} is not installed: {fix}")
    served = [v["name"] for v in crd["spec"].get("versions", []) if v.get("served")]
    if VERSION not in served:
        raise CrdError(f"CRD {name} does not serve {VERSION} (only {', '.join(served)}): {fix}")
    if (crd["spec"].get("conversion") or {}).get("strategy") != "Webhook":
        raise CrdError(f"CRD {name} has no conversion webhook: {fix}")


def client_config(settings: Settings, ca_pem: bytes) -> dict[str, Any]:
    import base64

    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
    if settings.webhook_url:
        config["url"] = settings.webhook_url
    elif settings.webhook_service:
        namespace, _, name = settings.webhook_service.partition("/")
        config["service"] = {
            "namespace": namespace,
            "name": name,
            "port": settings.webhook_service_port,
            "path": PATH,
        }
    else:
        config["url"] = f"https://127.0.0.1:{settings.webhook_port}{PATH}"
    return config


def point_crd(kube: Kube, name: str, wanted: dict[str, Any]) -> bool:
    """Point the CRD's conversion at `wanted`; True when it had to change."""
    crd = kube.request("GET", f"{CRD_PATH}/{name}")
    check_crd(crd, name)
    assert crd is not None
    webhook = crd["spec"]["conversion"].get("webhook") or {}
    if webhook.get("clientConfig") == wanted:
        return False
    patch = {
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    # null first: a merge patch keeps a `service` beside a new `url` otherwise.
                    "clientConfig": {"url": None, "service": None, **wanted},
                },
            }
        }
    }
    kube.request("PATCH", f"{CRD_PATH}/{name}", patch, content_type="application/merge-patch+json")
    return True


def malformed(review: Any) -> str:
    """Why `review` is not a ConversionReview the webhook can answer ("" when it is one)."""
    if not isinstance(review, dict):
        return "the body is not a JSON object"
    if review.get("apiVersion") != REVIEW_VERSION or review.get("kind") != "ConversionReview":
        return f"apiVersion and kind must be {REVIEW_VERSION} ConversionReview"
    request = review.get("request")
    if not isinstance(request, dict):
        return "request is missing"
    for key in ("uid", "desiredAPIVersion"):
        if not isinstance(request.get(key), str) or not request[key]:
            return f"request.{key} is missing"
    objects = request.get("objects")
    if not isinstance(objects, list):
        return "request.objects is missing" if objects is None else "request.objects is not a list"
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict):
            return f"request.objects[{i}] is not an object"
    return ""


def answer(body: bytes) -> tuple[int, bytes]:
    """The status and body answering a request's body (in a thread: parsing and converting
    a large review takes a while)."""
    status, text = _answer(body)
    if status != 200:
        STATS.count("malformed")
    return status, text


def _answer(body: bytes) -> tuple[int, bytes]:
    try:
        review = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return 400, b"not a ConversionReview: the body is not JSON"
    problem = malformed(review)
    if problem:
        return 400, f"not a ConversionReview: {problem}".encode()
    try:
        response = conversion.review_response(review)
    except RecursionError:
        return 400, b"not a ConversionReview: an object is nested too deeply"
    failed = response["response"]["result"].get("status") != "Success"
    STATS.count("failed" if failed else "converted")
    return 200, json.dumps(response).encode()


class Converter:
    """The `/convert` handler: the body capped at `max_body`, answered in threads of its own."""

    def __init__(self, max_body: int = MAX_BODY_BYTES, threads: int = CONVERSION_THREADS):
        self.max_body = max_body
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="conversion")
        self.large = asyncio.Lock()

    def too_large(self) -> web.Response:
        STATS.count("too_large")
        limit = f"{self.max_body} bytes"
        return web.Response(status=413, text=f"request body too large: at most {limit} accepted")

    async def handle(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > self.max_body:
            return self.too_large()
        try:
            body = await request.read()  # stops once past the app's client_max_size
        except web.HTTPRequestEntityTooLarge:
            return self.too_large()
        loop = asyncio.get_running_loop()
        if len(body) > self.max_body // 4:
            async with self.large:
                status, text = await loop.run_in_executor(self.pool, answer, body)
        else:
            status, text = await loop.run_in_executor(self.pool, answer, body)
        kind = "application/json" if status == 200 else "text/plain"
        return web.Response(status=status, body=text, content_type=kind)

    def app(self) -> web.Application:
        """An aiohttp application serving `PATH`; its threads end with its cleanup."""
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(PATH, self.handle)

        async def cleanup(_: web.Application) -> None:
            self.pool.shutdown(wait=False, cancel_futures=True)

        app.on_cleanup.append(cleanup)
        return app


@dataclass
class Webhook:
    settings: Settings
    kube: Kube
    run: Callable[..., Awaitable[Any]]
    runner: web.AppRunner | None = None
    context: ssl.SSLContext | None = None
    certs: webhook_certs.Certificates | None = None
    max_body: int = MAX_BODY_BYTES

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.run(fn, *args)  # type: ignore[no-any-return]

    def _names(self) -> list[str]:
        return webhook_certs.dns_names(self.settings.webhook_service)

    async def _load(self) -> webhook_certs.Certificates:
        certs = await self._call(
            webhook_certs.ensure,
            self.kube,
            own_namespace(self.settings, self.kube),
            self.settings.webhook_secret,
            self._names(),
        )
        if certs != self.certs:
            context = self.context or ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            # The key lives in a private temporary file only as long as loading takes.
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
                fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(certs.key_pem)
                with open(cert, "wb") as out:
                    out.write(certs.cert_pem)
                context.load_cert_chain(cert, key)  # new connections use the new one
            self.context, self.certs = context, certs
            STATS.certificate_expiry = _expiry(certs)
        return certs

    async def point(self) -> None:
        assert self.certs is not None
        wanted = client_config(self.settings, self.certs.ca_pem)
        for name in crd_names():
            if await self._call(point_crd, self.kube, name, wanted):
                log.info("conversion webhook of CRD %s now points at this operator", name)

    async def start(self) -> None:
        await self._load()
        self.runner = web.AppRunner(Converter(self.max_body).app(), access_log=None)
        await self.runner.setup()
        host = "127.0.0.1" if not self.settings.webhook_service else "0.0.0.0"
        site = web.TCPSite(self.runner, host, self.settings.webhook_port, ssl_context=self.context)
        await site.start()
        log.info("conversion webhook serving on %s:%s%s", host, self.settings.webhook_port, PATH)
        await self.point()

    async def maintain(self) -> None:
        """Hourly: renew the certificates when due and keep the CRDs pointed here."""
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await self._load()
                await self.point()
            except (KubeError, CrdError, OSError) as exc:
                log.warning("conversion webhook upkeep failed (retried in 1h): %s", exc)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def _expiry(certs: webhook_certs.Certificates) -> float | None:
    """When the first of the serving certificate and its CA expires (Unix seconds), from the
    annotations written with them; None if they cannot be read."""
    try:
        ends = [datetime.fromisoformat(t) for t in (certs.not_after, certs.ca_not_after)]
    except ValueError:
        return None
    return min(end.timestamp() for end in ends)


def own_namespace(settings: Settings, kube: Kube) -> str:
    return settings.namespace or kube.creds.namespace or "default"


async def check_crds(kube: Kube, run: Callable[..., Awaitable[Any]]) -> None:
    """Wait until the API server serves our kinds; CrdError when it serves them at an older
    version only, or (where the CRDs may be read) without a conversion webhook."""
    delay = 0.5
    wanted = {k.plural for k in KINDS}
    while True:
        try:
            served = await run(kube.request, "GET", f"/apis/{GROUP}/{VERSION}")
            missing = wanted - {r.get("name") for r in (served or {}).get("resources", [])}
            if not missing:
                for name in crd_names():
                    try:
                        crd = await run(kube.request, "GET", f"{CRD_PATH}/{name}")
                        check_crd(crd, name)
                        schema_defaults.remember(crd, VERSION)
                    except KubeError as exc:
                        if exc.status != 403:
                            raise
                        # No right to read CRDs (a webhook served elsewhere): discovery
                        # has shown the version served, which is what this process needs.
                return
            old = await run(kube.request, "GET", f"/apis/{GROUP}/{conversion.V1ALPHA1}")
            if wanted & {r.get("name") for r in (old or {}).get("resources", [])}:
                name = f"{sorted(missing)[0]}.{GROUP}"
                raise CrdError(
                    f"CRD {name} does not serve {VERSION}: apply this release's CRDs first "
                    "(kubectl apply --server-side -f crds/, or helm upgrade)"
                )
            log.warning("waiting for the CRDs of %s to be served", ", ".join(sorted(missing)))
        except KubeError as exc:
            log.warning("waiting for the API server: %s", exc)
        except OSError as exc:
            log.warning("waiting for the API server: %s", exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def serve(settings: Settings, kube: Kube, run: Callable[..., Awaitable[Any]]) -> Webhook:
    """Check the CRDs, then start serving and point them here (see module doc)."""
    await check_crds(kube, run)
    hook = Webhook(settings, kube, run)
    delay = 0.5
    while True:
        try:
            await hook.start()
            return hook
        except (KubeError, OSError) as exc:
            if isinstance(exc, KubeError) and exc.status in (401, 403):
                raise CrdError(f"conversion webhook: {exc.message}") from None
            await hook.stop()
            log.warning("conversion webhook not started yet: %s", exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)
