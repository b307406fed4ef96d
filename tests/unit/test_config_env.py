"""Settings from the environment: a value that is not a number is one line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from provisioner.config import ConfigError, Settings


def test_numbers_from_the_environment(monkeypatch):
    monkeypatch.setenv("PROVISIONER_METRICS_PORT", "9090")
    monkeypatch.setenv("PROVISIONER_RESYNC_SECONDS", "4.5")
    settings = Settings.from_env()
    assert (settings.metrics_port, settings.resync_seconds) == (9090, 4.5)


def test_a_service_link_variable_is_named_with_the_fix(monkeypatch):
    # What a pod gets for a Service named provisioner-metrics, unless service links are off.
    monkeypatch.setenv("PROVISIONER_METRICS_PORT", "tcp://10.0.0.175:9090")
    with pytest.raises(ConfigError, match=r"PROVISIONER_METRICS_PORT=.* enableServiceLinks"):
        Settings.from_env()


def test_the_cli_says_it_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "provisioner", "run"],
        env={"PROVISIONER_WORKERS": "many", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "provisioner: PROVISIONER_WORKERS='many' is not a number"
