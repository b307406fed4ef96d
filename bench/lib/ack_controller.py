"""ACK's s3-controller for bench/ack.py: its binary and CRDs, built once per machine and
cached in ~/.cache/provisioner/ack-s3-controller-<version>/ like the control plane's binaries
(provisioner_dev/binaries.py); the controller as a child process; and moto answering, as AWS
does, the one read the controller depends on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from provisioner_dev import binaries
from provisioner_dev.awsenv import DEV_CREDENTIALS, DEV_REGION
from provisioner_dev.launch import Stack
from provisioner_dev.processes import LoopbackService, free_port
from provisioner_dev.services import http_up as _http_up

ACK_MODULE = "github.com/aws-controllers-k8s/s3-controller"
ACK_VERSION = "v1.10.0"


def ack_component(version: str, module_dir: Path | None = None) -> binaries.Component:
    """ACK's s3-controller as a cached component (`controller`, beside it `crds/`)."""
    return binaries.Component(
        name="ack-s3-controller",
        version=version,
        module_dir=module_dir or Path(),
        packages={"controller": "./cmd/controller"},
        ldflags=f"-s -w -X {ACK_MODULE}/pkg/version.GitVersion={version}",
    )


def crd_files(module_dir: Path) -> list[Path]:
    """ACK's CRDs in a module: the service's (config/crd/bases) and the common ones."""
    found = sorted((module_dir / "config" / "crd" / "bases").glob("*.yaml"))
    found += sorted((module_dir / "config" / "crd" / "common" / "bases").glob("*.yaml"))
    return found


def cached_ack(version: str) -> tuple[Path, Path] | None:
    """(controller binary, CRD directory) from the cache, if both are there and intact."""
    component = ack_component(version)
    found = binaries.cached_binaries(component)
    crds = component.cache_dir / "crds"
    if found is None or not any(crds.glob("*.yaml")):
        return None
    return found["controller"], crds


def _copy_crds(files: list[Path], cache_dir: Path) -> None:
    if not files:
        raise binaries.BuildError("no CRDs found (config/crd/bases, config/crd/common/bases)")
    target = cache_dir / "crds"
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, target / f.name)


def adopt_ack(version: str, binary: Path, crd_dir: Path) -> tuple[Path, Path]:
    """Put a controller built elsewhere (and its CRDs: a module's root or a directory of
    YAML files) into the cache, with a manifest as provisioner_dev/binaries.py writes."""
    component = ack_component(version)
    probe = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False)
    if "--aws-endpoint-url" not in probe.stdout + probe.stderr:
        raise binaries.BuildError(f"{binary} --help does not look like an ACK controller")
    files = crd_files(crd_dir) or sorted(crd_dir.glob("*.yaml"))
    staging = component.cache_dir.with_name(component.cache_dir.name + f".adopting-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy2(binary, staging / "controller")
    _copy_crds(files, staging)
    _write_manifest(staging, version)
    shutil.rmtree(component.cache_dir, ignore_errors=True)
    staging.rename(component.cache_dir)
    found = cached_ack(version)
    if found is None:
        raise binaries.BuildError(f"the cache in {component.cache_dir} does not verify")
    return found


def _write_manifest(directory: Path, version: str) -> None:
    path = directory / "controller"
    manifest = {
        "version": version,
        "binaries": {
            "controller": {
                "size": path.stat().st_size,
                "mtime": int(path.stat().st_mtime),
                "sha256": binaries._sha256(path),
            }
        },
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))


def download_module(version: str) -> Path:
    """ACK's module through the Go module proxy (`go mod download -json`): its directory in
    the module cache; BuildError with the proxy's own answer when it is refused."""
    go = binaries.go_binary()
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{ACK_MODULE}@{version}"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"Error": (done.stderr or done.stdout).strip()}
    if answer.get("Error") or not answer.get("Dir"):
        raise binaries.BuildError(
            f"the Go module proxy ({os.environ.get('GOPROXY') or 'GOPROXY default'}) did not "
            f"serve {ACK_MODULE}@{version}: {answer.get('Error', 'no directory')!s}; build the "
            "controller elsewhere and pass --ack-binary PATH --ack-crds DIR"
        )
    return Path(answer["Dir"])


def ensure_ack(version: str) -> tuple[Path, Path]:
    """The cached controller and CRDs, built once through the Go module proxy if missing."""
    found = cached_ack(version)
    if found is not None:
        return found
    module_dir = download_module(version)
    component = ack_component(version, module_dir)
    binaries.build(component)  # caches the binary (manifest.json) or raises BuildError
    _copy_crds(crd_files(module_dir), component.cache_dir)
    found = cached_ack(version)
    if found is None:
        raise binaries.BuildError(f"the cache in {component.cache_dir} does not verify")
    return found


@dataclass(kw_only=True)
class AckController(LoopbackService):
    """ACK's controller as a child process; `port` is its health probe's."""

    binary: Path
    kubeconfig: str
    endpoint_url: str
    namespace: str
    extra_args: list[str] = field(default_factory=list)

    def args(self, metrics_port: int) -> list[str]:
        return [
            str(self.binary),
            f"--aws-region={DEV_REGION}",
            f"--aws-endpoint-url={self.endpoint_url}",
            # STS too (GetCallerIdentity at start): nothing may leave the machine.
            f"--aws-identity-endpoint-url={self.endpoint_url}",
            "--allow-unsafe-aws-endpoint-urls",
            "--aws-endpoint-use-path-style",
            "--enable-development-logging=false",
            "--log-level=info",
            f"--watch-namespace={self.namespace}",
            "--enable-leader-election=false",
            f"--healthz-addr=127.0.0.1:{self.port}",
            f"--metrics-addr=127.0.0.1:{metrics_port}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        env = dict(
            os.environ,
            KUBECONFIG=self.kubeconfig,
            AWS_REGION=DEV_REGION,
            AWS_DEFAULT_REGION=DEV_REGION,
            # Any client the flags miss goes to moto too; no instance metadata lookups.
            AWS_ENDPOINT_URL=self.endpoint_url,
            AWS_EC2_METADATA_DISABLED="true",
            **DEV_CREDENTIALS,
        )
        # ACK's runtime wraps the SDK's HTTP client, so the SDK cannot add a CA bundle to it:
        # with AWS_CA_BUNDLE set every reconcile fails ("unable to add custom RootCAs
        # HTTPClient"). moto is plain HTTP: no bundle needed.
        env.pop("AWS_CA_BUNDLE", None)
        self.launch(
            self.args(free_port()),
            lambda: _http_up(f"{self.url}/healthz"),
            what="ACK s3-controller",
            timeout=timeout,
            env=env,
        )


# -- moto as AWS answers one read ACK depends on ---------------------------------------------------

# AWS has encrypted every new bucket with SSE-S3 since January 2023, so GetBucketEncryption
# always finds a configuration; moto answers ServerSideEncryptionConfigurationNotFoundError for
# a bucket nobody configured, and ACK's read (hook.go, addPutFieldsToSpec) then dereferences
# the missing answer and panics on every reconcile. moto's server process alone loads this
# (PYTHONPATH), so that it answers AWS's default; nothing else changes.
MOTO_SITECUSTOMIZE = """\
import importlib.abc
import importlib.util
import sys

AWS_DEFAULT = {
    "Rule": {
        "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
        "BucketKeyEnabled": False,
    }
}


def _patch(models):
    original = models.S3Backend.get_bucket_encryption

    def get_bucket_encryption(self, bucket_name):
        return original(self, bucket_name) or AWS_DEFAULT

    models.S3Backend.get_bucket_encryption = get_bucket_encryption


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "moto.s3.models":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
"""


def moto_with_aws_defaults(stack: Stack) -> None:
    """Start the stack's moto with MOTO_SITECUSTOMIZE on its PYTHONPATH (and only moto's)."""
    where = stack.dir / "moto-aws-defaults"
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(MOTO_SITECUSTOMIZE)
    start = stack.cloud.start

    def start_moto(timeout: float = 60.0) -> None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), saved) if p)
        try:
            start(timeout=timeout)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved

    stack.cloud.start = start_moto  # type: ignore[method-assign]
