"""LocalStack without Docker: its Python runtime in a virtualenv of its own, on loopback.

LocalStack's free edition offers S3 and SQS (not RDS). The virtualenv lives in
~/.cache/provisioner/localstack-<version>/ and is made once per machine; these pins are
known to work together on Python 3.11.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from provisioner.kinds.registry import KINDS
from provisioner_dev.binaries import cache_root
from provisioner_dev.processes import LoopbackService, free_port

LOCALSTACK_VERSION = "4.7.0"
PACKAGES = [
    f"localstack-core[runtime]=={LOCALSTACK_VERSION}",
    "cbor2==5.6.5",
    "pyopenssl==24.2.1",
    "cryptography==43.0.3",
    "service-identity==23.1.0",
]
# The services of the kinds LocalStack's free edition offers (RDS is not among them), and STS,
# which tells the operator its account id (a Topic's ARN is built from it).
SERVICES = tuple(sorted({k.service for k in KINDS if k.on_localstack} | {"sts"}))


def venv_dir() -> Path:
    return cache_root() / f"localstack-{LOCALSTACK_VERSION}"


def ensure_localstack() -> Path:
    """The LocalStack virtualenv's python, installing it once per machine."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists() and python.exists():
        return python
    print(
        f"provisioner: installing LocalStack {LOCALSTACK_VERSION} into {venv} (once)",
        file=sys.stderr,
    )
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PACKAGES],
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            "installing LocalStack failed (see pip's output above): check access to PyPI"
        )
    marker.write_text(" ".join(PACKAGES))
    return python


def _health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/_localstack/health", timeout=2) as resp:  # noqa: S310
        return json.loads(resp.read())


@dataclass(kw_only=True)
class LocalStackServer(LoopbackService):
    """Same surface as MotoServer (url, start, stop), without request recording."""

    data_dir: Path
    record_to: Path | None = None

    def start(self, timeout: float = 120.0) -> None:
        python = ensure_localstack()
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PROVISIONER_"))}
        env.update(
            DNS_ADDRESS="0",
            GATEWAY_LISTEN=f"127.0.0.1:{self.port}",
            SERVICES=",".join(SERVICES),
            SQS_ENDPOINT_STRATEGY="path",
            LOCALSTACK_VOLUME_DIR=str(self.data_dir / "volume"),
            FILESYSTEM_ROOT=str(self.data_dir / "fs"),
            TMPDIR=str(self.data_dir / "tmp"),
            DISABLE_EVENTS="1",
            SKIP_SSL_CERT_DOWNLOAD="1",
            PERSISTENCE="0",
        )
        (self.data_dir / "tmp").mkdir(exist_ok=True)

        def ready() -> bool:
            services = _health(self.url).get("services", {})
            return all(services.get(s) in ("available", "running") for s in SERVICES)

        self.launch(
            [str(python), "-m", "localstack.runtime.main"],
            ready,
            what="LocalStack",
            timeout=timeout,
            env=env,
        )

    def stop(self, kill: bool = False, timeout: float = 15.0) -> None:
        super().stop(kill=kill, timeout=timeout)
