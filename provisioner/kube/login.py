"""Where the Kubernetes API is and who the operator is there: in a pod, its ServiceAccount;
elsewhere, the current context of a kubeconfig.

What a pod and the kubeconfigs people use need, without a Kubernetes client library:
- in a pod: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the mounted CA, and
  the mounted token, read again whenever the kubelet rotates the file;
- a kubeconfig (`$KUBECONFIG`, several files joined by `:`, or `~/.kube/config`): a token, a
  client certificate (file or data), basic auth, or an `exec` plugin (as EKS's
  `aws eks get-token` and other clouds' use), run again before its credential expires.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# An exec credential is renewed this long before it expires.
EXEC_RENEW_SECONDS = 60.0


class LoginError(RuntimeError):
    """No usable credentials; the message says where it looked and what was wrong."""


@dataclass
class Credentials:
    server: str
    ca_data: bytes | None = None  # PEM
    insecure: bool = False
    token: str | None = None
    token_path: Path | None = None  # read again when the file changes (rotated tokens)
    cert_data: bytes | None = None  # PEM
    key_data: bytes | None = None  # PEM
    username: str | None = None
    password: str | None = None
    namespace: str | None = None
    exec_config: dict[str, Any] | None = None
    expires: float | None = None  # epoch seconds: an exec credential's end
    _token_mtime: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- the bearer token, as it is now ------------------------------------------------------

    def bearer(self) -> str | None:
        """The token to send now: a rotated file is read again, an expiring exec credential
        is renewed."""
        with self._lock:
            if self.token_path is not None:
                try:
                    mtime = self.token_path.stat().st_mtime
                    if mtime != self._token_mtime:
                        self.token = self.token_path.read_text().strip() or None
                        self._token_mtime = mtime
                except OSError:
                    pass  # keep the last token: the next write of the file brings a new one
            if self.exec_config is not None and (
                self.token is None
                or (self.expires is not None and self.expires - time.time() < EXEC_RENEW_SECONDS)
            ):
                self._run_exec()
            return self.token

    def headers(self) -> dict[str, str]:
        token = self.bearer()
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.username is not None:
            basic = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}
        return {}

    def _run_exec(self) -> None:
        cfg = self.exec_config or {}
        command = [str(cfg.get("command", "")), *map(str, cfg.get("args") or [])]
        env = dict(os.environ)
        for item in cfg.get("env") or []:
            env[str(item["name"])] = str(item["value"])
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LoginError(f"the kubeconfig's exec plugin {command[0]!r} failed: {exc}") from None
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or [""])[-1]
            raise LoginError(
                f"the kubeconfig's exec plugin {command[0]!r} exited {result.returncode}: {last}"
            )
        try:
            status = json.loads(result.stdout).get("status") or {}
        except ValueError:
            raise LoginError(f"the exec plugin {command[0]!r} printed no ExecCredential") from None
        self.token = status.get("token") or None
        if status.get("clientCertificateData"):
            self.cert_data = status["clientCertificateData"].encode()
            self.key_data = (status.get("clientKeyData") or "").encode()
        stamp = status.get("expirationTimestamp")
        self.expires = (
            datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None
        )

    # -- TLS ------------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data:
            ctx = ssl.create_default_context(cadata=self.ca_data.decode())
        else:
            ctx = ssl.create_default_context()
        self.bearer()  # an exec plugin may answer with a client certificate
        if self.cert_data and self.key_data:
            # ssl loads certificates from files only: written for the call, then removed.
            with tempfile.TemporaryDirectory(prefix="provisioner-tls-") as tmp:
                cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
                cert.write_bytes(self.cert_data)
                key.touch(mode=0o600)
                key.write_bytes(self.key_data)
                ctx.load_cert_chain(cert, key)
        return ctx


def in_cluster(directory: Path = SERVICE_ACCOUNT_DIR) -> Credentials | None:
    """The pod's ServiceAccount, as client-go's rest.InClusterConfig finds it; None outside
    a pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token = directory / "token"
    if not host or not port or not token.exists():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = directory / "ca.crt"
    ns = directory / "namespace"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_data=ca.read_bytes() if ca.exists() else None,
        token_path=token,
        namespace=ns.read_text().strip() if ns.exists() else None,
    )


def _kubeconfig_paths() -> list[Path]:
    value = os.environ.get("KUBECONFIG")
    if value:
        return [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    default = Path("~/.kube/config").expanduser()
    return [default] if default.exists() else []


def _data(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """`<key>-data` (base64) or the file `<key>` (relative to the kubeconfig's folder)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        return (base / str(entry[key])).expanduser().read_bytes()
    return None


def from_kubeconfig(paths: list[Path] | None = None) -> Credentials | None:
    """The current context of the kubeconfig files (the first file to name a thing wins, as
    kubectl merges them); None when there is no kubeconfig."""
    paths = _kubeconfig_paths() if paths is None else paths
    if not paths:
        return None
    current: str | None = None
    found: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
        "contexts": {},
        "clusters": {},
        "users": {},
    }
    for path in paths:
        if not path.exists():
            continue
        config = yaml.safe_load(path.read_text()) or {}
        current = current or config.get("current-context")
        for section, named in found.items():
            singular = section[:-1]
            for item in config.get(section) or []:
                named.setdefault(item["name"], (item.get(singular) or {}, path.parent))
    if not current or current not in found["contexts"]:
        raise LoginError(f"no current context in {os.pathsep.join(map(str, paths))}")
    context, _ = found["contexts"][current]
    if context.get("cluster") not in found["clusters"]:
        raise LoginError(f"context {current!r} names no known cluster")
    cluster, cluster_dir = found["clusters"][context["cluster"]]
    user, user_dir = found["users"].get(context.get("user", ""), ({}, Path.cwd()))
    token_file = user.get("tokenFile")
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        ca_data=_data(cluster, "certificate-authority", cluster_dir),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=user.get("token"),
        token_path=(user_dir / token_file) if token_file else None,
        cert_data=_data(user, "client-certificate", user_dir),
        key_data=_data(user, "client-key", user_dir),
        username=user.get("username"),
        password=user.get("password"),
        namespace=context.get("namespace"),
        exec_config=user.get("exec"),
    )


def login() -> Credentials:
    """In a pod, its ServiceAccount; else the kubeconfig; else one clear error."""
    found = in_cluster() or from_kubeconfig()
    if found is None:
        raise LoginError(
            "no Kubernetes credentials: not in a pod (no KUBERNETES_SERVICE_HOST and "
            f"{SERVICE_ACCOUNT_DIR}/token), and no kubeconfig ($KUBECONFIG or ~/.kube/config)"
        )
    return found
