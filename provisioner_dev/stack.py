"""The whole local setup: control plane, moto's server, CRDs and the operator.

`provisioner dev up` keeps its state in `.dev/` (git-ignored) and its data in a
temporary directory; `dev down` stops everything and removes both. A second `dev up`
restarts only what is not running: a dead operator is started again against the same
control plane and moto; only a dead control plane or moto makes it start over.

The parts are started by `launch.Stack` (control plane, moto, CRDs) and `services` (the
operator); what `.dev/state.json` says of them is read by `devstate`, and an existing cluster
(`dev up --kubeconfig`) is checked and cleaned up by `external_cluster`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from provisioner_dev import admission, observability
from provisioner_dev.awsenv import aws_env
from provisioner_dev.awslike import AwsLikeProxy
from provisioner_dev.cloudprofile import CloudProfile
from provisioner_dev.crds import install_crds
from provisioner_dev.devstate import (
    CONTROLLER_MANAGER,
    MOTO,
    OBSERVABILITY,
    OPERATOR,
    PROXY,
    STATE_VERSION,
    DevState,
    record,
)
from provisioner_dev.external_cluster import check_cluster, remove_from_cluster
from provisioner_dev.kubectl import cluster_server
from provisioner_dev.launch import Stack
from provisioner_dev.processes import fixed_port, stop
from provisioner_dev.services import (
    DEV_CLUSTER_ID,
    MotoServer,
    OperatorProcess,
)

# The parts of a local stack, as the tests and bench/ import them from here.


def _note(message: str) -> None:
    print(f"provisioner: {message}", file=sys.stderr)


class DevStack(DevState):
    """The state behind `provisioner dev up/status/down`, kept in `.dev/` (see DevState):
    what starts a dev environment, keeps what still runs, and stops it."""

    def clean(self, state: dict | None) -> None:
        if state and state.get("external_cluster"):
            remove_from_cluster(state)
        if state:
            for proc in reversed(list(state.get("processes", {}).values())):
                if self.is_alive(proc):
                    stop(proc["pid"], timeout=15.0 if proc["part"] == OPERATOR else 10.0)
            shutil.rmtree(state.get("data_dir", ""), ignore_errors=True)
        for name in ("state.json", "env", "kubeconfig"):
            (self.dev_dir / name).unlink(missing_ok=True)

    def up(
        self,
        with_operator: bool = True,
        cloud: CloudProfile | None = None,
        kubeconfig: Path | None = None,
        backends: tuple[str, ...] = (),
    ) -> dict:
        """Start what is not running; keep the control plane and moto when they run.

        `cloud` is the aws-like profile (None: moto as it is); a running environment keeps
        the profile it was started with (`dev up` refuses another one before calling this).
        `backends`: the observability backends to run (observability.BACKENDS' names); a
        running environment keeps those it was started with.
        """
        state = self.load()
        if state:
            problems = self.dead(state, wait=10.0)
            if not problems:
                return self._keep(state, with_operator)
            _note(
                f"{'; '.join(problems)}: stopping the rest of the old dev environment and "
                "starting over (its CRs, Secrets and cloud resources are gone)"
            )
        self.clean(state)
        if kubeconfig is not None:
            return self._start_external(kubeconfig, with_operator, cloud, backends)
        return self._start(with_operator, cloud, backends)

    def _start_observability(self, state: dict, names: list[str]) -> None:
        """The backends named, recorded in `state` (processes with the part OBSERVABILITY);
        the operator is given a metrics port for them to scrape."""
        state.setdefault("metrics_port", fixed_port())
        for name, service in observability.start_backends(self.dev_dir, state, names).items():
            state["processes"][name] = record(name, service.proc.pid, service.log, OBSERVABILITY)

    def _stop_backends(self, state: dict) -> None:
        for name in state.get(OBSERVABILITY) or {}:
            proc = state.get("processes", {}).get(name)
            if proc is not None and self.is_alive(proc):
                stop(proc["pid"])

    def _start_external(
        self,
        kubeconfig: Path,
        with_operator: bool,
        cloud: CloudProfile | None,
        backends: tuple[str, ...],
    ) -> dict:
        """An existing cluster: its CRDs installed, moto and the operator run here."""
        kubeconfig = kubeconfig.resolve()
        wanted = check_cluster(kubeconfig)
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="provisioner-dev-"))
        started = time.monotonic()
        moto = MotoServer(log=self.dev_dir / "moto.log")
        proxy: AwsLikeProxy | None = None
        state: dict = {}
        try:
            moto.start()
            assert moto.proc is not None
            processes = {MOTO: record(MOTO, moto.proc.pid, moto.log)}
            proxy, endpoint = self._start_proxy(moto.url, cloud, processes)
            state = {
                "version": STATE_VERSION,
                "data_dir": str(data_dir),
                "external_cluster": cluster_server(kubeconfig),
                "kubeconfig": str(kubeconfig),
                "installed_crds": wanted,
                "moto_url": moto.url,
                "cloud_profile": cloud.name if cloud else "instant",
                "cloud_url": endpoint,
                "with_operator": with_operator,
                "processes": processes,
            }
            install_crds(kubeconfig)
            self._as_installed(state)
            if backends:
                self._start_observability(state, list(backends))
            if with_operator:
                self._start_operator(state)
        except BaseException:
            if state:
                self._stop_backends(state)
                remove_from_cluster(state)
            if proxy is not None:
                proxy.stop()
            moto.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        state["started_in_seconds"] = round(time.monotonic() - started, 2)
        self.save(state)
        self._write_env(state)
        return state

    def _start_proxy(
        self, moto_url: str, cloud: CloudProfile | None, processes: dict
    ) -> tuple[AwsLikeProxy | None, str]:
        """The aws-like profile's proxy in front of moto (recorded in `processes`), and the
        endpoint the operator and `.dev/env` use: the proxy's, or moto's without a profile."""
        if cloud is None:
            return None, moto_url
        log = self.dev_dir / "awslike.log"
        proxy = AwsLikeProxy(upstream=moto_url, profile=cloud.name, args=cloud.args, log=log)
        proxy.start()
        assert proxy.proc is not None
        processes[PROXY] = record(PROXY, proxy.proc.pid, log)
        return proxy, proxy.url

    def _start(
        self, with_operator: bool, cloud: CloudProfile | None, backends: tuple[str, ...]
    ) -> dict:
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="provisioner-dev-"))
        started = time.monotonic()
        stack = Stack(dir=data_dir, log_dir=self.dev_dir, serve_webhook=False)
        kubeconfig = self.dev_dir / "kubeconfig"
        proxy: AwsLikeProxy | None = None
        state: dict = {}
        try:
            stack.start()
            shutil.copy(stack.kubeconfig, kubeconfig)
            kubeconfig.chmod(0o600)
            cp = stack.controlplane
            cp_state = cp.state()
            processes = {
                name: record(name, pid, cp.logs / f"{name}.log")
                for name, pid in cp_state.pids.items()
            }
            assert stack.cloud.proc is not None
            processes[MOTO] = record(MOTO, stack.cloud.proc.pid, stack.cloud.log)
            proxy, endpoint = self._start_proxy(stack.cloud.url, cloud, processes)
            state = {
                "version": STATE_VERSION,
                "data_dir": str(data_dir),
                "controlplane": cp_state.to_json(),
                "kubeconfig": str(kubeconfig),
                "moto_url": stack.cloud.url,
                "cloud_profile": cloud.name if cloud else "instant",
                "cloud_url": endpoint,
                "with_operator": with_operator,
                "processes": processes,
                "gc": CONTROLLER_MANAGER in processes,
            }
            self._as_installed(state)
            if backends:
                self._start_observability(state, list(backends))
            if with_operator:
                self._start_operator(state)
        except BaseException:
            self._stop_backends(state)
            if proxy is not None:
                proxy.stop()
            stack.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        state["started_in_seconds"] = round(time.monotonic() - started, 2)
        self.save(state)
        self._write_env(state)
        return state

    def _keep(self, state: dict, with_operator: bool) -> dict:
        """The control plane and moto run: start or stop only the operator (and any dead
        observability backend)."""
        if dead := self.dead_backends(state):
            _note(f"{', '.join(dead)} not running; starting it again (same address)")
            for name in dead:
                state["processes"].pop(name, None)
            self._start_observability(state, dead)
            self.save(state)
        proc = state["processes"].get(OPERATOR)
        operator = self.operator(state)
        if with_operator and operator == "running":
            _note("already running; nothing to start")
        elif with_operator:
            what = (
                f"the operator (pid {proc['pid']}) is dead; starting it again"
                if operator == "dead"
                else "starting the operator"
            )
            _note(f"{what}; the control plane and moto keep running (same ports, same .dev/env)")
            state["processes"].pop(OPERATOR, None)
            self.save(state)
            self._start_operator(state)
        elif operator == "running":
            stop(proc["pid"], timeout=15.0)
            state["processes"].pop(OPERATOR)
            _note(
                f"stopped the operator (pid {proc['pid']}) that an earlier `dev up` started, "
                "so that you can run your own: source .dev/env && provisioner run"
            )
        else:
            state["processes"].pop(OPERATOR, None)
            _note("already running, without an operator (--no-operator); nothing to start")
        state["with_operator"] = with_operator
        self.save(state)
        self._write_env(state)
        return state

    @staticmethod
    def _as_installed(state: dict) -> None:
        """What the chart installs around the operator: its admission policies and roles,
        and spec.access through IRSA (provisioner_dev/admission.py)."""
        admission.set_up(state, state["kubeconfig"])

    def _start_operator(self, state: dict) -> None:
        # It serves the CRDs' conversion webhook itself, on loopback, and runs as the chart
        # runs it (requested-by verified, spec.access with IRSA).
        operator = OperatorProcess(
            kubeconfig=state["kubeconfig"],
            endpoint_url=state.get("cloud_url", state["moto_url"]),
            log=self.dev_dir / "operator.log",
            extra_args=[f"--webhook-port={fixed_port()}", *admission.operator_args(state)],
            extra_env=observability.operator_env(state),
        )
        if state.get("metrics_port"):
            operator.extra_args.append(f"--metrics-port={state['metrics_port']}")
        try:
            operator.start()
        except BaseException:
            operator.stop()
            raise
        assert operator.proc is not None
        state["processes"][OPERATOR] = record(OPERATOR, operator.proc.pid, operator.log)

    def _write_env(self, state: dict) -> None:
        """`.dev/env` and `.dev/kubeconfig`: the same bytes as long as the control plane lives."""
        kubeconfig = Path(state["kubeconfig"])
        if not kubeconfig.exists():
            shutil.copy(state["controlplane"]["kubeconfig"], kubeconfig)
            kubeconfig.chmod(0o600)
        env_lines = {
            "KUBECONFIG": str(kubeconfig.resolve()),
            **aws_env(state.get("cloud_url", state["moto_url"])),
            "PROVISIONER_CLUSTER_ID": DEV_CLUSTER_ID,
            **admission.operator_env(state),
        }
        if state.get("metrics_port"):
            # An operator of your own (`dev up --no-operator`) is scraped where dev up's would be.
            env_lines["PROVISIONER_METRICS_PORT"] = str(state["metrics_port"])
        # ... and traced where dev up's would be.
        env_lines.update(observability.operator_env(state))
        text = "".join(f"export {k}={v}\n" for k, v in env_lines.items())
        env = self.dev_dir / "env"
        if not env.exists() or env.read_text() != text:
            env.write_text(text)

    def down(self) -> bool:
        state = self.load()
        self.clean(state)
        return state is not None
