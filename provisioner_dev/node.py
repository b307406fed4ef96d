"""A real node beside a local control plane: kubelet, kube-proxy and kube-scheduler (built from
the same pinned Kubernetes module), containerd and runc (Debian's), and a bridge network from
the CNI reference plugins (Debian's containernetworking-plugins). Pods run for real: the chart's
Deployment, probes, ServiceAccount tokens, Services and PodDisruptionBudgets.

What this machine needs and what is set to get it:
- cgroup v1 (what these VMs have): the kubelet's `failCgroupV1: false`, driver cgroupfs;
- root without CAP_SYS_RESOURCE (these VMs drop it): runc cannot lower a process's
  oom_score_adj, which the CRI plugin asks for its sandboxes (-998), so containerd's
  `restrict_oom_score_adj` keeps every value at or above its own;
- no registry: the pause image is a static C program built here with gcc and imported into
  containerd with the operator's image (`load_image`), pulled never.

Everything lives in one directory (containerd's root and state, runc's state, the kubelet's
root, CNI's IP allocations); `stop()` takes out what the node made: pods, containers, shims,
mounts, kube-proxy's iptables chains and the bridge.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import yaml

from provisioner_dev.binaries import ensure_node
from provisioner_dev.controlplane import NODE_GATEWAY, ControlPlane
from provisioner_dev.kubectl import run_kubectl
from provisioner_dev.processes import StartError, free_port, spawn, stop, wait_until

BRIDGE = "provisioner0"
POD_CIDR = "10.244.0.0/24"
# The bridge's own address on the host: pods reach the API server and moto there.
GATEWAY = NODE_GATEWAY
PAUSE_IMAGE = "localhost/provisioner-pause:1"
NODE_TOOLS = ("containerd", "ctr", "runc", "iptables", "ip", "gcc", "buildah")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")

PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


class NodeError(RuntimeError):
    pass


def cni_bin_dir() -> str | None:
    return next((d for d in CNI_BIN_DIRS if Path(d, "bridge").exists()), None)


def cannot_run() -> str | None:
    """Why a node cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "a kubelet needs root"
    missing = [t for t in NODE_TOOLS if shutil.which(t) is None]
    if missing:
        debian = "containerd runc iptables iproute2 gcc buildah"
        return f"{', '.join(missing)} not installed (Debian's packages: {debian})"
    if cni_bin_dir() is None:
        return "the CNI plugins are not installed (Debian: containernetworking-plugins)"
    if not Path("/sys/fs/cgroup").exists():
        return "no cgroup filesystem at /sys/fs/cgroup"
    return None


def _run(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


class Node:
    def __init__(self, directory: Path, controlplane: ControlPlane, name: str = "node-1") -> None:
        self.dir = directory
        self.cp = controlplane
        self.name = name
        self.logs = directory / "logs"
        self.sock = directory / "containerd.sock"
        self.runc_root = directory / "runc"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.binaries: dict[str, Path] = {}

    # -- start -----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        why = cannot_run()
        if why:
            raise NodeError(why)
        self.binaries = binaries = ensure_node()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._network()
            self._containerd(timeout)
            self._pause_image()
            self._scheduler(binaries["kube-scheduler"], timeout)
            self._proxy(binaries["kube-proxy"])
            self._kubelet(binaries["kubelet"])
            wait_until(self.ready, timeout=timeout, what=f"node {self.name} Ready")
        except BaseException:
            self.stop()
            raise

    def kubectl(self, *args: str, check: bool = True) -> str:
        result = run_kubectl(self.cp.kubeconfig, *args, timeout=60)
        if check and result.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def ready(self) -> bool:
        out = self.kubectl(
            "get", "node", self.name, "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status}', check=False,
        )  # fmt: skip
        return out.strip() == "True"

    def _network(self) -> None:
        """The bridge with the gateway address, made before any pod so that the API server's
        advertised address exists; CNI's bridge plugin then uses it as it is."""
        if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
        addrs = _run("ip", "-4", "addr", "show", BRIDGE).stdout
        if f"{GATEWAY}/" not in addrs:
            _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for path in (
            "/proc/sys/net/ipv4/ip_forward",
            "/proc/sys/net/bridge/bridge-nf-call-iptables",
        ):
            try:
                Path(path).write_text("1")
            except OSError:
                pass  # routed traffic to the gateway and ClusterIPs works without them
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "provisioner-dev",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"},
            ],
        }
        (cni / "10-provisioner.conflist").write_text(json.dumps(conflist, indent=1))

    def _containerd(self, timeout: float) -> None:
        cri = '"io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{self.dir / "containerd"}"
state = "{self.dir / "containerd-state"}"
[grpc]
  address = "{self.sock}"
[plugins.{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins.{cri}.containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins.{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.{cri}.containerd.runtimes.runc.options]
        Root = "{self.runc_root}"
  [plugins.{cri}.cni]
    bin_dir = "{cni_bin_dir()}"
    conf_dir = "{self.dir / "cni"}"
"""
        path = self.dir / "containerd.toml"
        path.write_text(config)
        log = self.logs / "containerd.log"
        self.procs["containerd"] = proc = spawn(["containerd", "--config", str(path)], log)
        wait_until(
            lambda: self._ctr("version", check=False).returncode == 0,
            timeout=timeout, what="containerd", proc=proc, log=log,
        )  # fmt: skip

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args, check=check)

    def _pause_image(self) -> None:
        if PAUSE_IMAGE in self._ctr("images", "ls", "-q").stdout.split():
            return
        build = self.dir / "pause"
        build.mkdir(exist_ok=True)
        (build / "pause.c").write_text(PAUSE_C)
        _run("gcc", "-static", "-Os", "-s", "-o", str(build / "pause"), str(build / "pause.c"))
        (build / "Containerfile").write_text(
            'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
        )
        storage = ("--storage-driver", "vfs")
        _run("buildah", *storage, "bud", "--isolation", "chroot", "--layers=false",
             "-t", PAUSE_IMAGE, str(build))  # fmt: skip
        self.load_image(PAUSE_IMAGE)

    def load_image(self, ref: str) -> None:
        """An image from buildah's storage into containerd's, so that pods run it unpulled."""
        archive = self.dir / "image.tar"
        archive.unlink(missing_ok=True)
        _run("buildah", "--storage-driver", "vfs", "push", ref, f"oci-archive:{archive}:{ref}",
             timeout=600)  # fmt: skip
        self._ctr("images", "import", "--snapshotter", "native", str(archive), check=True)
        archive.unlink()

    def _scheduler(self, binary: Path, timeout: float) -> None:
        kubeconfig = str(self.cp.kubeconfig)
        self.procs["kube-scheduler"] = spawn(
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=0",
            ],
            self.logs / "kube-scheduler.log",
        )

    def _proxy(self, binary: Path) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": self.name,
            "clientConnection": {"kubeconfig": str(self.cp.kubeconfig)},
            # No sysctl writes for conntrack's table size: kept as the kernel has it.
            "conntrack": {"maxPerCore": 0, "min": 0},
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "iptables": {"localhostNodePorts": False},
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.procs["kube-proxy"] = spawn(
            [str(binary), f"--config={path}", "--v=0"], self.logs / "kube-proxy.log"
        )

    def _kubelet(self, binary: Path) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "failSwapOn": False,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "enforceNodeAllocatable": [],
            "resolvConf": "/etc/resolv.conf",
            "podLogsDir": str(self.dir / "pod-logs"),
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }
        path = self.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self.procs["kubelet"] = spawn(
            [
                str(binary),
                f"--config={path}",
                f"--kubeconfig={self.cp.kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={GATEWAY}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                "--v=0",
            ],
            self.logs / "kubelet.log",
        )

    # -- stop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Pods first (the kubelet tears their sandboxes and networks down), then the node's
        processes, then whatever is left of containers, shims, mounts, rules and the bridge."""
        if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            self.kubectl("delete", "pods", "--all", "-A", "--grace-period=2", "--wait=false",
                         check=False)  # fmt: skip
            with contextlib.suppress(StartError):
                wait_until(self._no_tasks, timeout=60, what="the node's pods to stop")
        for name in ("kubelet", "kube-proxy", "kube-scheduler"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc.pid)
        self._remove_containers()
        proc = self.procs.pop("containerd", None)
        if proc is not None:
            stop(proc.pid)
        proxy = self.binaries.get("kube-proxy")
        if proxy is not None:
            _run(str(proxy), "--cleanup", check=False)
            _remove_kube_chains()
        self._unmount()
        _run("ip", "link", "delete", BRIDGE, check=False)
        # The kubelet links every container's log from /var/log/containers, wherever it keeps
        # the logs themselves.
        links = Path("/var/log/containers")
        if links.is_dir():
            for link in links.iterdir():
                if link.is_symlink() and str(self.dir) in os.readlink(link):
                    link.unlink()

    def _no_tasks(self) -> bool:
        return not self._ctr("tasks", "ls", "-q", check=False).stdout.strip()

    def _remove_containers(self) -> None:
        if self.runc_root.exists():
            for cid in _run(
                "runc", "--root", str(self.runc_root), "list", "-q", check=False
            ).stdout.split():
                _run("runc", "--root", str(self.runc_root), "delete", "--force", cid, check=False)
        # containerd's shims for this node's containers outlive it: found by its socket.
        for pid in _pids_with(str(self.sock)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _unmount(self) -> None:
        """Volumes, sandboxes' /dev/shm and network namespaces the node left mounted."""
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        points = [line.split()[1] for line in mounts]
        mine = [p for p in points if p.startswith(str(self.dir) + "/")]
        netns = self._netns()
        for point in sorted(set(mine + netns), key=len, reverse=True):
            _run("umount", "-l", point, check=False)
        for ns in netns:
            Path(ns).unlink(missing_ok=True)

    @staticmethod
    def _netns() -> list[str]:
        """The network namespaces CNI made for sandboxes (one node per machine: the bridge's
        name is fixed)."""
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        return [line.split()[1] for line in mounts if "/netns/cni-" in line.split()[1]]


def _remove_kube_chains() -> None:
    """The iptables chains the kubelet makes (KUBE-FIREWALL, its canaries) and any kube-proxy
    left: the jumps to them first, then the chains."""
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
            for rule in rules:
                parts = shlex.split(rule)
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                    _run(tool, "-t", table, "-D", *parts[1:], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for chain in chains:
                _run(tool, "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run(tool, "-t", table, "-X", chain, check=False)


def _pids_with(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids
