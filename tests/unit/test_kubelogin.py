"""Credentials without a client library: a pod's ServiceAccount and the kubeconfigs people use
(tokens, certificates, exec plugins such as EKS's). The end-to-end tests log in through these
for real (kubeconfig with a token or certificate; the image test's pod ServiceAccount)."""

from __future__ import annotations

import base64
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from provisioner.kube import login as kubelogin


def sa_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    (d / "token").write_text("t1\n")
    (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    (d / "namespace").write_text("platform")
    return d


def test_in_a_pod_the_service_account_and_the_service_address(tmp_path, monkeypatch):
    d = sa_dir(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = kubelogin.in_cluster(d)
    assert creds is not None
    assert creds.server == "https://10.96.0.1:443"
    assert creds.namespace == "platform"
    assert creds.ca_data and b"BEGIN CERTIFICATE" in creds.ca_data
    assert creds.headers() == {"Authorization": "Bearer t1"}


def test_a_rotated_token_file_is_read_again(tmp_path, monkeypatch):
    d = sa_dir(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    creds = kubelogin.in_cluster(d)
    assert creds is not None and creds.server == "https://[fd00::1]:6443"
    assert creds.bearer() == "t1"
    (d / "token").write_text("t2")
    os.utime(d / "token", (time.time() + 5, time.time() + 5))
    assert creds.bearer() == "t2"


def test_outside_a_pod_no_service_account(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubelogin.in_cluster(sa_dir(tmp_path)) is None


def write_config(path: Path, user: dict, cluster: dict | None = None, ns: str | None = None):
    context = {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster or {"server": "https://k:6443/"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": context}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_kubeconfig_with_a_token_and_inline_ca(tmp_path):
    ca = base64.b64encode(b"PEM").decode()
    path = write_config(
        tmp_path / "config",
        {"token": "abc"},
        {"server": "https://k:6443/", "certificate-authority-data": ca},
        ns="team",
    )
    creds = kubelogin.from_kubeconfig([path])
    assert creds is not None
    assert (creds.server, creds.ca_data, creds.namespace) == ("https://k:6443", b"PEM", "team")
    assert creds.headers() == {"Authorization": "Bearer abc"}


def test_kubeconfig_files_relative_to_the_kubeconfig(tmp_path):
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "me.crt").write_bytes(b"CERT")
    (tmp_path / "me.key").write_bytes(b"KEY")
    path = write_config(
        tmp_path / "config",
        {"client-certificate": "me.crt", "client-key": "me.key"},
        {"server": "https://k", "certificate-authority": "ca.crt"},
    )
    creds = kubelogin.from_kubeconfig([path])
    assert creds is not None
    assert (creds.ca_data, creds.cert_data, creds.key_data) == (b"CA", b"CERT", b"KEY")
    assert creds.headers() == {}


def test_the_first_file_of_several_wins(tmp_path):
    first = write_config(tmp_path / "a", {"token": "first"})
    second = write_config(tmp_path / "b", {"token": "second"})
    creds = kubelogin.from_kubeconfig([first, second])
    assert creds is not None and creds.bearer() == "first"


def test_no_current_context_is_one_clear_error(tmp_path):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config"}))
    with pytest.raises(kubelogin.LoginError, match="no current context"):
        kubelogin.from_kubeconfig([path])


def exec_plugin(tmp_path: Path, lifetime: float) -> Path:
    """An exec credential plugin (as `aws eks get-token` is) counting its runs in a file."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, sys, datetime, pathlib\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(n))\n"
        "end = datetime.datetime.now(datetime.UTC) + "
        f"datetime.timedelta(seconds={lifetime})\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': {'token': f'token-{n}-' + sys.argv[1], "
        "'expirationTimestamp': end.strftime('%Y-%m-%dT%H:%M:%SZ')}}))\n"
    )
    return script


def test_an_exec_plugin_gives_the_token_and_runs_again_before_it_expires(tmp_path):
    script = exec_plugin(tmp_path, lifetime=30)  # inside the renewal margin: renewed each time
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script), "eks"],
        }
    }
    creds = kubelogin.from_kubeconfig([write_config(tmp_path / "config", user)])
    assert creds is not None
    assert creds.bearer() == "token-1-eks"
    assert creds.expires is not None and creds.expires > datetime.now(UTC).timestamp()
    assert creds.bearer() == "token-2-eks"


def test_an_exec_token_far_from_expiry_is_reused(tmp_path):
    script = exec_plugin(tmp_path, lifetime=900)
    user = {"exec": {"command": sys.executable, "args": [str(script), "x"]}}
    creds = kubelogin.from_kubeconfig([write_config(tmp_path / "config", user)])
    assert creds is not None
    assert [creds.bearer(), creds.bearer()] == ["token-1-x", "token-1-x"]


def test_a_failing_exec_plugin_says_so_in_one_line(tmp_path):
    user = {"exec": {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no SSO')"]}}
    creds = kubelogin.from_kubeconfig([write_config(tmp_path / "config", user)])
    assert creds is not None
    with pytest.raises(kubelogin.LoginError, match="exited 1: no SSO"):
        creds.bearer()


def test_nothing_found_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(kubelogin.LoginError, match="no Kubernetes credentials"):
        kubelogin.login()
