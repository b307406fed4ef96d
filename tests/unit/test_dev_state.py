"""What `.dev/state.json` tells `dev up`: whose pid is whose, and whether it is still ours."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner_dev.processes import alive, same_alive, start_time
from provisioner_dev.stack import DevStack


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stack_with(tmp_path: Path, state: dict) -> DevStack:
    (tmp_path / ".dev").mkdir()
    (tmp_path / ".dev/state.json").write_text(json.dumps(state))
    return DevStack(tmp_path / ".dev")


def test_a_pid_is_ours_only_with_the_start_time_we_recorded(sleeper):
    started = start_time(sleeper.pid)
    assert started is not None
    assert same_alive(sleeper.pid, started)
    assert not same_alive(sleeper.pid, started + 1), "a reused pid passed for ours"
    assert not same_alive(dead_pid(), None)


def test_clean_stops_our_processes_and_leaves_a_reused_pid_alone(tmp_path, sleeper):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        stack = stack_with(
            tmp_path,
            {
                "processes": {
                    "moto": {"pid": other.pid, "start_time": start_time(other.pid), "part": "moto"},
                    "operator": {
                        "pid": sleeper.pid,
                        "start_time": start_time(sleeper.pid) + 1,
                        "part": "operator",
                    },
                },
            },
        )
        stack.clean(stack.load())
        other.wait(timeout=15)
        assert alive(sleeper.pid), "stopped a process that only shares a pid with ours"
        assert not (tmp_path / ".dev/state.json").exists()
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_operator_is_running_dead_or_never_started(tmp_path, sleeper):
    ours = {"pid": sleeper.pid, "start_time": start_time(sleeper.pid), "part": "operator"}
    stack = stack_with(tmp_path, {"processes": {}})
    assert stack.operator({"processes": {}}) == "not started"
    assert stack.operator({"processes": {"operator": ours}}) == "running"
    gone = {"pid": dead_pid(), "start_time": None, "part": "operator"}
    assert stack.operator({"processes": {"operator": gone}}) == "dead"


def test_a_dead_control_plane_process_or_moto_is_named(tmp_path, sleeper):
    ours = {"pid": sleeper.pid, "start_time": start_time(sleeper.pid)}
    state = {
        "processes": {
            "etcd": {**ours, "part": "control plane"},
            "kube-apiserver": {"pid": dead_pid(), "start_time": None, "part": "control plane"},
            "kube-controller-manager": {**ours, "part": "control plane"},
            "moto": {"pid": dead_pid(), "start_time": None, "part": "moto"},
            "operator": {"pid": dead_pid(), "start_time": None, "part": "operator"},
        }
    }
    state.update(controlplane={}, moto_url="http://127.0.0.1:1")
    assert DevStack(tmp_path).dead(state) == ["kube-apiserver and moto are dead"]
    del state["processes"]["kube-controller-manager"]
    assert "kube-controller-manager missing" in DevStack(tmp_path).dead(state)[0]


def test_a_state_file_without_parts_is_read_by_name(tmp_path):
    stack = stack_with(tmp_path, {"pids": {"etcd": 11, "moto": 12, "operator": 13}})
    state = stack.load()
    assert state is not None
    assert {name: p["part"] for name, p in state["processes"].items()} == {
        "etcd": "control plane",
        "moto": "moto",
        "operator": "operator",
    }
    assert state["with_operator"] is True


def test_a_dead_observability_backend_is_restartable_not_a_reason_to_start_over(tmp_path, sleeper):
    ours = {"pid": sleeper.pid, "start_time": start_time(sleeper.pid)}
    gone = {"pid": dead_pid(), "start_time": None, "part": "observability"}
    state = {
        "processes": {
            "etcd": {**ours, "part": "control plane"},
            "moto": {**ours, "part": "moto"},
            "prometheus": gone,
            "jaeger": {**ours, "part": "observability"},
        },
        "observability": {"prometheus": {"url": "http://x"}, "jaeger": {"url": "http://y"}},
    }
    stack = DevStack(tmp_path)
    assert stack._dead_holders(state["processes"]) == []  # the data holders all run
    assert stack.dead_backends(state) == ["prometheus"]
    del state["processes"]["prometheus"]  # recorded as a backend, its process never was
    assert stack.dead_backends(state) == ["prometheus"]
    assert stack.dead_backends({"processes": state["processes"]}) == []


def test_the_operator_gets_the_environment_of_the_backends_recorded():
    from provisioner_dev import observability

    state = {
        "observability": {
            "prometheus": {"url": "http://p", "operator_env": {}},
            "jaeger": {"url": "http://j", "operator_env": {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}},
        }
    }
    assert observability.operator_env(state) == {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}
    assert observability.operator_env({}) == {}
    assert "prometheus" in observability.names()
