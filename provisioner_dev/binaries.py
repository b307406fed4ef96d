"""Build (once per machine) and find the control-plane binaries.

kube-apiserver and kube-controller-manager are built from the pinned Kubernetes Go
modules in hack/controlplane, etcd from its Go module in hack/etcd. The results are
cached outside the repository under ~/.cache/provisioner/<component>-<version>/ with
a manifest of SHA-256 sums; a cache whose manifest is missing or does not match is
rebuilt.

helm (hack/helm) is built the same way, but only on demand by `ensure_helm()`: the
chart tests need it, the control plane does not; so are a node's kubelet, kube-proxy and
kube-scheduler (hack/node, `ensure_node()`), for the test that runs the chart's pods;
kro's controller (hack/kro, provisioner_dev/kro.py), for the test of docs/composition.md; and
Prometheus and promtool (hack/prometheus, provisioner_dev/prometheus.py), for the alert rules'
and dashboards' tests and `provisioner dev up --observability`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner_dev.buildprogress import BuildProgress

REPO_ROOT = Path(__file__).resolve().parents[1]
KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.22.0"
# The Kubernetes minor version helm's client-go (v0.37) speaks; upstream's Makefile passes
# it so that `helm template` and `helm lint` assume that version rather than 1.20.
HELM_K8S_MAJOR, HELM_K8S_MINOR = "1", "37"
MIN_GO = (1, 26)


class BuildError(RuntimeError):
    """A build step failed; the message is one line saying what and what to do."""


@dataclass(frozen=True)
class Component:
    name: str
    version: str
    module_dir: Path
    packages: dict[str, str]  # binary name -> Go package
    ldflags: str
    tags: str = ""

    @property
    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"


def cache_root() -> Path:
    base = os.environ.get("PROVISIONER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "provisioner"
    )
    return Path(base)


def _version_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    build_date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return " ".join(
        [
            "-s -w",
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    )


def components() -> list[Component]:
    return [
        Component(
            name="k8s",
            version=KUBERNETES_VERSION,
            module_dir=REPO_ROOT / "hack" / "controlplane",
            packages={
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            },
            ldflags=_version_ldflags(),
            tags="selinux,notest",
        ),
        Component(
            name="etcd",
            version=ETCD_VERSION,
            module_dir=REPO_ROOT / "hack" / "etcd",
            packages={"etcd": "go.etcd.io/etcd/server/v3"},
            ldflags="-s -w",
        ),
    ]


def node_component() -> Component:
    """A node's binaries (kubelet, kube-proxy) and kube-scheduler, from the same pinned
    Kubernetes module as the control plane; built on demand by `ensure_node()`."""
    return Component(
        name="node",
        version=KUBERNETES_VERSION,
        module_dir=REPO_ROOT / "hack" / "node",
        packages={
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        },
        ldflags=_version_ldflags(),
        tags="selinux,notest",
    )


def helm_component() -> Component:
    pkg = "helm.sh/helm/v3"
    return Component(
        name="helm",
        version=HELM_VERSION,
        module_dir=REPO_ROOT / "hack" / "helm",
        packages={"helm": f"{pkg}/cmd/helm"},
        ldflags=" ".join(
            [
                "-s -w",
                f"-X {pkg}/internal/version.version={HELM_VERSION}",
                f"-X {pkg}/internal/version.gitTreeState=clean",
                f"-X {pkg}/pkg/lint/rules.k8sVersionMajor={HELM_K8S_MAJOR}",
                f"-X {pkg}/pkg/lint/rules.k8sVersionMinor={HELM_K8S_MINOR}",
                f"-X {pkg}/pkg/chartutil.k8sVersionMajor={HELM_K8S_MAJOR}",
                f"-X {pkg}/pkg/chartutil.k8sVersionMinor={HELM_K8S_MINOR}",
            ]
        ),
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_binaries(component: Component) -> dict[str, Path] | None:
    """The cached binaries if the cache is complete and intact, else None."""
    manifest_path = component.cache_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return None
    found: dict[str, Path] = {}
    for binary in component.packages:
        path = component.cache_dir / binary
        entry = manifest.get("binaries", {}).get(binary)
        if not entry or not path.is_file() or path.stat().st_size != entry.get("size"):
            return None
        # A size match plus a matching mtime is enough on the hot path; the full
        # checksum is verified when the mtime moved (copied or touched caches).
        if int(path.stat().st_mtime) != entry.get("mtime") and _sha256(path) != entry.get("sha256"):
            return None
        found[binary] = path
    return found


def go_binary() -> str:
    go = shutil.which("go")
    if not go:
        raise BuildError(
            "Go toolchain not found on PATH: install Go >= 1.26 "
            "(e.g. `apt-get install golang-1.26` or the go.dev tarball) and run again"
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    try:
        version = out.split()[2].removeprefix("go")
        major, minor = (int(x) for x in version.split(".")[:2])
    except (IndexError, ValueError):
        raise BuildError(f"cannot read the Go version from `go version`: {out.strip()!r}") from None
    if (major, minor) < MIN_GO:
        raise BuildError(
            f"Go {version} is too old to build Kubernetes {KUBERNETES_VERSION}: "
            f"install Go >= {MIN_GO[0]}.{MIN_GO[1]}"
        )
    return go


def _log(message: str) -> None:
    print(f"provisioner: {message}", file=sys.stderr, flush=True)


GO_ENV = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}


def count_packages(go: str, cwd: Path, packages: list[str]) -> int:
    """How many packages building `packages` compiles at most (`go list -deps`); 0 if unknown."""
    try:
        listed = subprocess.run(
            [go, "list", "-deps", *packages],
            cwd=cwd,
            env=dict(os.environ, **GO_ENV),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return len(listed.stdout.split()) if listed.returncode == 0 else 0


def _run_go(
    go: str, args: list[str], cwd: Path, what: str, progress: BuildProgress | None = None
) -> None:
    """Run a go command, printing progress while it compiles and one line if it fails."""
    env = dict(os.environ, **GO_ENV)
    started = time.monotonic()
    last_print = started
    compiled = 0
    tail: list[str] = []
    proc = subprocess.Popen(
        [go, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = ([*tail, line])[-20:]
        package = bool(line) and not line.startswith(("go: downloading", "#")) and " " not in line
        if package and progress is not None:
            progress.compiled()
            continue
        compiled += package
        now = time.monotonic()
        if progress is None and now - last_print >= 15:
            _log(f"{what}: {compiled} packages built, {now - started:.0f}s so far")
            last_print = now
    code = proc.wait()
    if code != 0:
        detail = next(
            (t for t in reversed(tail) if "error" in t.lower() or "cannot" in t.lower()),
            tail[-1] if tail else "",
        )
        hint = (
            "check access to the Go module proxy (GOPROXY)"
            if any(w in " ".join(tail) for w in ("dial tcp", "proxy", "download", "i/o timeout"))
            else "see the output above"
        )
        for t in tail:
            print(f"  | {t}", file=sys.stderr)
        raise BuildError(f"{what} failed ({detail.strip()}): {hint}")


def build(component: Component) -> dict[str, Path]:
    go = go_binary()
    out_dir = component.cache_dir
    staging = out_dir.with_name(out_dir.name + f".building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    _log(f"building {component.name} {component.version} (once per machine; cached in {out_dir})")
    _run_go(
        go,
        ["mod", "download"],
        component.module_dir,
        f"downloading Go modules for {component.name}",
    )
    total = count_packages(go, component.module_dir, list(component.packages.values()))
    what = f"building {component.name} {component.version}"
    progress = BuildProgress(what, total) if total else None
    for binary, package in component.packages.items():
        args = [
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            component.ldflags,
            "-o",
            str(staging / binary),
        ]
        if component.tags:
            args[2:2] = ["-tags", component.tags]
        _run_go(go, [*args, package], component.module_dir, f"building {binary}", progress)
    if progress is not None:
        progress.finish()
    manifest: dict[str, Any] = {"version": component.version, "binaries": {}}
    for binary in component.packages:
        path = staging / binary
        manifest["binaries"][binary] = {
            "size": path.stat().st_size,
            "mtime": int(path.stat().st_mtime),
            "sha256": _sha256(path),
        }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    _log(f"built {component.name} {component.version} in {time.monotonic() - started:.0f}s")
    found = cached_binaries(component)
    if found is None:
        raise BuildError(
            f"the freshly built cache in {out_dir} does not verify; remove it and retry"
        )
    return found


def ensure(component: Component) -> dict[str, Path]:
    """One component's binaries, building them if they are missing or corrupt."""
    found = cached_binaries(component)
    if found is None:
        if component.cache_dir.exists():
            _log(f"cache {component.cache_dir} is incomplete or corrupt; rebuilding")
        found = build(component)
    return found


# The binaries envtest ships (controller-runtime's setup-envtest): no kube-controller-manager.
ENVTEST_REQUIRED = ("kube-apiserver", "etcd")
CONTROLLER_MANAGER = "kube-controller-manager"
_said: set[str] = set()


def _once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        _log(message)


def envtest_binaries() -> dict[str, Path] | None:
    """The binaries in $KUBEBUILDER_ASSETS (envtest's kube-apiserver and etcd), if it is set.

    kube-controller-manager is taken from there too if present, else from this project's
    cache if it was built; without one the control plane runs without it (no garbage
    collector, no namespace controller).
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    where = Path(assets)
    found = {
        name: where / name
        for name in (*ENVTEST_REQUIRED, CONTROLLER_MANAGER)
        if (where / name).is_file() and os.access(where / name, os.X_OK)
    }
    missing = [name for name in ENVTEST_REQUIRED if name not in found]
    if missing:
        raise BuildError(
            f"KUBEBUILDER_ASSETS={assets} has no executable {' or '.join(missing)}: point it "
            "at envtest's binaries (`setup-envtest use -p path`) or unset it to build them"
        )
    if CONTROLLER_MANAGER not in found:
        cached = cached_binaries(components()[0]) or {}
        if CONTROLLER_MANAGER in cached:
            found[CONTROLLER_MANAGER] = cached[CONTROLLER_MANAGER]
    extra = (
        f"; {CONTROLLER_MANAGER} from {found[CONTROLLER_MANAGER].parent}"
        if CONTROLLER_MANAGER in found
        else f"; no {CONTROLLER_MANAGER} there, so no garbage collector or namespace controller"
    )
    _once(f"using kube-apiserver and etcd from KUBEBUILDER_ASSETS={assets}{extra}")
    return found


def ensure_binaries() -> dict[str, Path]:
    """All control-plane binaries: envtest's when $KUBEBUILDER_ASSETS is set, else this
    project's own, building whatever is missing or corrupt (not helm)."""
    envtest = envtest_binaries()
    if envtest is not None:
        return envtest
    missing = [c for c in components() if cached_binaries(c) is None]
    if missing:
        go_binary()  # no Go toolchain: that one line, and nothing about a build
        _once(
            "the control plane is built from source once per machine (about 8 minutes on 2 "
            "cores, then cached); to skip it, set KUBEBUILDER_ASSETS to a directory with "
            "envtest's kube-apiserver and etcd, or use a cluster you have: `provisioner dev up "
            "--kubeconfig PATH`, PROVISIONER_TEST_KUBECONFIG=PATH for the tests"
        )
    paths: dict[str, Path] = {}
    for component in components():
        paths.update(ensure(component))
    return paths


def cached_helm() -> Path | None:
    """The cached helm binary if it is built and intact; never builds."""
    found = cached_binaries(helm_component())
    return found["helm"] if found else None


def ensure_helm() -> Path:
    """The helm binary, built on demand (a few minutes on 2 cores, once per machine)."""
    return ensure(helm_component())["helm"]


def ensure_node() -> dict[str, Path]:
    """kubelet, kube-proxy and kube-scheduler, built on demand (once per machine)."""
    return ensure(node_component())
