"""The Dockerfile, checked without building it (there is no container engine here).

What is checked: the builder and the rootfs stage start from the same base, BASE_IMAGE, whose
default is an exactly pinned python 3.11 slim-bookworm tag (`make image` passes a Debian-made
one instead); the rootfs stage copies the builder's virtualenv and installs nothing itself; the
image is that root filesystem alone (FROM scratch, one COPY); the builder installs the package
without extras against constraints.txt, and the dependency closure of that install (read from
the installed distributions' metadata) holds no dev tool or Kubernetes client.
The final user is numeric and not root, the entrypoint is `provisioner run`, and the image
works on a read-only root filesystem (no bytecode writes, HOME on the /tmp emptyDir).
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEV_TOOLS = {"moto", "pytest", "pytest-timeout", "ruff"}
# The dev harness's; the operator never imports it (pyproject's import contract).
NOT_IN_IMAGE = {"kubernetes"}
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    result = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    found = {}
    for keyword, args in instructions(ROOT / "Dockerfile"):
        if keyword == "FROM":
            break
        assert keyword == "ARG", f"{keyword} before the first FROM"
        name, _, default = args.partition("=")
        found[name] = default
    return found


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(ROOT / "Dockerfile"):
        if keyword == "FROM":
            found.append([])
        if not found:
            continue
        found[-1].append((keyword, args))
    return found


def test_every_stage_starts_from_an_exactly_pinned_base():
    builder, rootfs, final = stages()
    assert PINNED_BASE.match(global_args()["BASE_IMAGE"]), "BASE_IMAGE is not an exact tag"
    assert builder[0][1] == "${BASE_IMAGE} AS builder"
    assert rootfs[0][1] == "${BASE_IMAGE} AS rootfs"
    assert final[0][1] == "scratch", "the image is the rootfs stage's tree, one layer"


def test_builder_installs_the_package_without_extras_against_the_constraints():
    runs = " ".join(args for keyword, args in stages()[0] if keyword == "RUN")
    assert "pip install --no-cache-dir -c constraints.txt ." in runs
    assert "[dev]" not in runs and "-e " not in runs
    assert not any(tool in runs for tool in DEV_TOOLS)


def test_rootfs_stage_only_copies_the_virtualenv_and_the_image_only_the_rootfs():
    _, rootfs, final = stages()
    copies = [args for keyword, args in rootfs if keyword == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    runs = " ".join(args for keyword, args in rootfs if keyword == "RUN")
    assert "pip install" not in runs and "apt-get" not in runs, "the rootfs installs nothing"
    assert not any(tool in runs for tool in DEV_TOOLS)
    assert [args for keyword, args in final if keyword in ("COPY", "ADD")] == ["--from=rootfs / /"]
    assert not [args for keyword, args in final if keyword == "RUN"]


def test_final_user_is_numeric_and_not_root():
    users = [args for keyword, args in stages()[-1] if keyword == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert int(user) == 65532
    runs = " ".join(args for keyword, args in stages()[1] if keyword == "RUN")
    assert "--uid 65532" in runs, "uid 65532 has a passwd entry (kopf calls getpass.getuser())"


def test_entrypoint_runs_the_operator():
    entrypoints = [args for keyword, args in stages()[-1] if keyword == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["provisioner", "run"]
    assert not [args for keyword, args in stages()[-1] if keyword == "CMD"]


def test_runtime_works_on_a_read_only_root_filesystem():
    env = " ".join(args for keyword, args in stages()[-1] if keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env
    assert "PATH=/opt/venv/bin:" in env


def test_dockerignore_keeps_the_context_to_the_package():
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "constraints.txt", "README.md", "provisioner"}


def runtime_closure() -> set[str]:
    """Every distribution `pip install .` pulls in: provisioner's requirements without extras."""
    seen: set[str] = set()
    todo = ["provisioner"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_the_installed_closure_holds_no_dev_tool_and_is_fully_constrained():
    closure = runtime_closure()
    assert "kopf" in closure and "boto3" in closure
    assert not closure & {canonicalize_name(t) for t in DEV_TOOLS | NOT_IN_IMAGE}
    pinned = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    assert closure - {"provisioner"} <= pinned, closure - pinned - {"provisioner"}
