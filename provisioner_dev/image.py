"""The operator's image, built from the project's Dockerfile with buildah.

No registry is needed: the base (Debian bookworm with its python3.11) is made from Debian's
own packages with mmdebstrap, cached as a tarball in ~/.cache/provisioner/image, imported
into buildah's storage and passed to the Dockerfile as BASE_IMAGE. The image is tagged with
a hash of everything it is built from, so an unchanged tree is never built twice.

Storage driver vfs and chroot isolation: no overlay mounts and no user namespaces needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provisioner_dev.binaries import cache_root

ROOT = Path(__file__).resolve().parents[1]
IMAGE_CACHE = cache_root() / "image"
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
# What both stages of the Dockerfile need from the base: python3.11 with venv (its ensurepip
# brings pip into the builder's virtualenv) and useradd/groupadd for the runtime's user.
BASE_PACKAGES = ("python3.11", "python3-venv", "passwd")
# Documentation, manual pages and translations are never read in the image.
BASE_DPKG_OPTS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
STORAGE = ("--storage-driver", "vfs")
IMAGE_NAME = "localhost/provisioner"
VERSION_TAG = "provisioner:0.1.0"
# The files the Dockerfile reads (see .dockerignore); a change to any of them is a new image.
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "constraints.txt", "README.md")
CONTEXT_DIRS = ("provisioner",)


class ImageError(RuntimeError):
    pass


def _note(message: str) -> None:
    print(f"provisioner: {message}", file=sys.stderr, flush=True)


def missing_tools() -> list[str]:
    return [t for t in ("buildah", "mmdebstrap", "runc") if shutil.which(t) is None]


def mirror_reachable(timeout: float = 20) -> bool:
    """Whether Debian's mirror answers (the base is made from its packages)."""
    import urllib.request

    try:
        release = f"{MIRROR}/dists/{SUITE}/Release"
        with urllib.request.urlopen(release, timeout=timeout) as r:  # noqa: S310 - fixed URL
            return bool(r.status == 200)
    except OSError:
        return False


def cannot_build(need_mirror: bool = True) -> str | None:
    """Why this machine cannot build (or run) the image, or None."""
    if sys.platform != "linux":
        return "images are built on Linux only"
    if os.geteuid() != 0:
        return "building and running the image (buildah, runc) needs root"
    missing = missing_tools()
    if missing:
        return f"{', '.join(missing)} not installed (`make image` installs them)"
    if need_mirror and not mirror_reachable():
        return f"Debian's mirror {MIRROR} cannot be reached"
    return None


def run_tool(cmd: list[str], log: Path | None = None, **kwargs: object) -> str:
    """Run buildah, mmdebstrap or runc: its output; with `log`, its output goes there (and
    "" is returned). ImageError, with the error's last lines, when it fails."""
    if log is None:
        result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
        if result.returncode != 0:
            raise ImageError(f"{cmd[0]} failed ({result.returncode}): {result.stderr.strip()}")
        return str(result.stdout)
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise ImageError(f"{cmd[0]} failed ({result.returncode}), see {log}:\n{tail}")
    return ""


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def base_command(target: Path) -> list[str]:
    cmd = ["mmdebstrap", "--variant=minbase", "--format=tar", "--quiet"]
    cmd.append('--aptopt=APT::Install-Recommends "false"')
    # /bin, /lib, /sbin as links into /usr made by mmdebstrap's own hook, not by installing
    # the usrmerge package (which brings perl, some 50 MB).
    cmd.append("--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
    cmd += [f"--dpkgopt={opt}" for opt in BASE_DPKG_OPTS]
    cmd.append(f"--include={','.join(BASE_PACKAGES)}")
    return [*cmd, SUITE, str(target), MIRROR]


def base_key() -> str:
    return _digest([json.dumps(base_command(Path("-"))).encode()])[:16]


def base_ref() -> str:
    """The base's name in buildah's storage."""
    return f"localhost/provisioner-base:{SUITE}-{base_key()}"


def image_ref() -> str:
    """The operator image's name for the tree as it is: a hash of everything it is built from."""
    return f"{IMAGE_NAME}:{context_key(base_ref())}"


def cached_image() -> str | None:
    """The image of the tree as it is, if it was built already."""
    if shutil.which("buildah") is None:
        return None
    ref = image_ref()
    return ref if _image_exists(ref) else None


def base_tarball(log: Path) -> Path:
    """Debian bookworm (minbase) with python3.11, made once per machine by mmdebstrap."""
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    target = IMAGE_CACHE / f"base-{SUITE}-{base_key()}.tar"
    if target.exists():
        return target
    _note(f"making the base with mmdebstrap ({SUITE}, minbase, {' '.join(BASE_PACKAGES)})")
    partial = target.with_suffix(".partial.tar")
    partial.unlink(missing_ok=True)
    run_tool(base_command(partial), log)
    partial.rename(target)
    return target


def _image_exists(ref: str) -> bool:
    result = subprocess.run(
        ["buildah", *STORAGE, "inspect", "--type", "image", ref],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0


def import_base(tarball: Path, log: Path) -> str:
    """The base tarball as an image in buildah's storage: `FROM scratch` + `ADD` of it."""
    ref = base_ref()
    if _image_exists(ref):
        return ref
    _note(f"importing {tarball.name} into buildah's storage as {ref}")
    with tempfile.TemporaryDirectory(prefix="provisioner-base-") as tmp:
        context = Path(tmp)
        shutil.copy(tarball, context / "rootfs.tar")
        (context / "Containerfile").write_text(
            'FROM scratch\nADD rootfs.tar /\nCMD ["/usr/bin/python3"]\n'
        )
        run_tool(
            [
                "buildah",
                *STORAGE,
                "bud",
                "--isolation",
                "chroot",
                "--layers=false",
                "-t",
                ref,
                str(context),
            ],
            log,
        )
    return ref


def context_key(base_ref: str, root: Path = ROOT) -> str:
    """A hash of the base and every file the Dockerfile's build reads."""
    parts = [base_ref.encode()]
    for name in CONTEXT_FILES:
        parts += [name.encode(), (root / name).read_bytes()]
    for d in CONTEXT_DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                parts += [str(path.relative_to(root)).encode(), path.read_bytes()]
    return _digest(parts)[:16]


@dataclass
class BuiltImage:
    ref: str
    built: bool  # False: found in buildah's storage, already built from the same inputs
    seconds: float
    version_tag: str = VERSION_TAG


def _pip_trust() -> list[str]:
    """Volumes for the build's RUN steps: the host's CA bundle, when pip here is told to use
    one (a TLS-inspecting proxy in front of PyPI), and a pip.conf pointing at it. Nothing of
    it ends up in the image."""
    bundle = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    if not bundle or not Path(bundle).is_file():
        return []
    conf = IMAGE_CACHE / "pip.conf"
    conf.write_text("[global]\ncert = /run/provisioner-build/ca.crt\n")
    return [
        "--volume", f"{bundle}:/run/provisioner-build/ca.crt:ro",
        "--volume", f"{conf}:/etc/pip.conf:ro",
    ]  # fmt: skip


def build(log: Path | None = None, tag_version: bool = True) -> BuiltImage:
    """The operator's image from the Dockerfile, built unless its inputs are unchanged."""
    started = time.monotonic()
    ref = image_ref()
    # Debian's mirror (and PyPI) are needed only when something is to be built.
    why = cannot_build(need_mirror=not _image_exists(ref) if shutil.which("buildah") else True)
    if why:
        raise ImageError(why)
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    log = log or IMAGE_CACHE / "build.log"
    built = False
    if not _image_exists(ref):
        log.write_text("")  # the log of this build only
        base = import_base(base_tarball(log), log)
        _note(f"building {ref} from the Dockerfile (base {base}); log in {log}")
        run_tool(
            [
                "buildah", *STORAGE, "bud", "--isolation", "chroot", "--layers=false",
                "--pull=false", "--build-arg", f"BASE_IMAGE={base}", *_pip_trust(),
                "-t", ref, str(ROOT),
            ],
            log,
        )  # fmt: skip
        built = True
    if tag_version:
        run_tool(["buildah", *STORAGE, "tag", ref, VERSION_TAG])
    if built:
        _forget_older(ref)
    return BuiltImage(ref=ref, built=built, seconds=time.monotonic() - started)


def _forget_older(ref: str) -> None:
    """Untag the images of earlier trees (vfs keeps full copies: they add up)."""
    out = run_tool(["buildah", *STORAGE, "images", "--format", "{{.Name}}:{{.Tag}}"])
    for name in out.split():
        if name.startswith(f"{IMAGE_NAME}:") and name not in (ref, f"localhost/{VERSION_TAG}"):
            subprocess.run(["buildah", *STORAGE, "rmi", name], capture_output=True)


def image_config(ref: str) -> dict:
    """The image's OCI config (entrypoint, env, user, working directory)."""
    out = run_tool(["buildah", *STORAGE, "inspect", "--type", "image", ref])
    return dict(json.loads(out)["OCIv1"]["config"])


class Rootfs:
    """A working container of the image, its root filesystem mounted (a plain directory)."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.container = run_tool(["buildah", *STORAGE, "from", "--pull=false", ref]).strip()
        self.path = Path(run_tool(["buildah", *STORAGE, "mount", self.container]).strip())

    def remove(self) -> None:
        subprocess.run(["buildah", *STORAGE, "rm", self.container], capture_output=True)


# What must never be in the image: the dev harness, tests, test and build tools.
FORBIDDEN = ("provisioner_dev", "tests", "moto", "pytest", "ruff", "mypy")
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "make")


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = Path(dirpath, f)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def site_packages(root: Path) -> Path:
    return next((root / "opt/venv/lib").glob("python3*/site-packages"))


def unwanted(root: Path) -> list[str]:
    """Paths in the image that must not be there (an empty list is the expected answer)."""
    found = []
    site = site_packages(root)
    for name in FORBIDDEN:
        if (site / name).exists() or (root / name).exists() or (root / "src" / name).exists():
            found.append(name)
    for bindir in ("usr/bin", "usr/local/bin", "opt/venv/bin"):
        for name in COMPILERS:
            if (root / bindir / name).exists():
                found.append(f"/{bindir}/{name}")
    return found


def image_contents(ref: str) -> list[str]:
    """A summary of what the image holds: its size (the bytes of its root filesystem, as
    its layers hold them uncompressed), the big parts, and what must be absent."""
    rootfs = Rootfs(ref)
    try:
        root = rootfs.path
        site = site_packages(root)
        lines = [
            f"size: {_du(root) / 1e6:.0f} MB",
            f"/usr (Debian, python3.11): {_du(root / 'usr') / 1e6:.0f} MB",
            f"/opt/venv (the operator and its dependencies): {_du(root / 'opt/venv') / 1e6:.0f} MB",
        ]
        sizes = sorted(
            ((_du(p), p.name) for p in site.iterdir() if p.is_dir() and "dist-info" not in p.name),
            reverse=True,
        )
        lines.append(
            "largest packages: "
            + ", ".join(f"{name} {size / 1e6:.1f} MB" for size, name in sizes[:6])
        )
        services = sorted(p.name for p in (site / "botocore/data").iterdir() if p.is_dir())
        lines.append(f"botocore service models: {', '.join(services)}")
        bad = unwanted(root)
        lines.append(
            f"absent: {', '.join(FORBIDDEN)}, compilers" if not bad else f"UNWANTED: {bad}"
        )
        return lines
    finally:
        rootfs.remove()
