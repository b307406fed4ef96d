"""The binary cache: a complete one is used, a partial or corrupt one is not."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from provisioner_dev.binaries import Component, cached_binaries


def component(tmp_path: Path, monkeypatch) -> Component:
    monkeypatch.setenv("PROVISIONER_CACHE", str(tmp_path))
    comp = Component(
        name="demo",
        version="v1",
        module_dir=tmp_path,
        packages={"a": "x/a", "b": "x/b"},
        ldflags="",
    )
    comp.cache_dir.mkdir(parents=True)
    manifest: dict[str, Any] = {"version": "v1", "binaries": {}}
    for name in ("a", "b"):
        path = comp.cache_dir / name
        path.write_bytes(f"binary {name}".encode())
        manifest["binaries"][name] = {
            "size": path.stat().st_size,
            "mtime": int(path.stat().st_mtime),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    (comp.cache_dir / "manifest.json").write_text(json.dumps(manifest))
    return comp


def test_complete_cache_is_used(tmp_path, monkeypatch):
    comp = component(tmp_path, monkeypatch)
    assert set(cached_binaries(comp)) == {"a", "b"}


def test_missing_manifest_means_rebuild(tmp_path, monkeypatch):
    comp = component(tmp_path, monkeypatch)
    (comp.cache_dir / "manifest.json").unlink()
    assert cached_binaries(comp) is None


def test_missing_binary_means_rebuild(tmp_path, monkeypatch):
    comp = component(tmp_path, monkeypatch)
    (comp.cache_dir / "b").unlink()
    assert cached_binaries(comp) is None


def test_truncated_binary_means_rebuild(tmp_path, monkeypatch):
    comp = component(tmp_path, monkeypatch)
    (comp.cache_dir / "a").write_bytes(b"bin")
    assert cached_binaries(comp) is None


def test_same_size_other_content_means_rebuild(tmp_path, monkeypatch):
    comp = component(tmp_path, monkeypatch)
    path = comp.cache_dir / "a"
    path.write_bytes(b"binary z")  # same length, other bytes
    os.utime(path, (1, 1))  # and a moved mtime, as a copy or a partial write leaves it
    assert cached_binaries(comp) is None


def test_build_progress_shows_a_bar_and_the_time_left(monkeypatch):
    import io

    from provisioner_dev import buildprogress

    clock = [1000.0]
    monkeypatch.setattr(buildprogress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()  # not a terminal: a line every 15 s
    progress = buildprogress.BuildProgress("building k8s v1.37.2", total=2000, stream=out)
    for _ in range(10):
        clock[0] += 1.0
        progress.compiled(50)
    assert out.getvalue() == ""  # nothing before 15 s
    clock[0] += 10.0
    progress.compiled(500)  # 1,000 of 2,000 in 20 s: 20 s left
    line = out.getvalue().strip()
    assert line.startswith("provisioner: building k8s v1.37.2: [###############...............]")
    assert "50% (1000/2000 packages), 20s so far, about 20s left" in line
    # Never shows 100 % before the build ends, even when the estimate was short.
    progress.done = 5000
    assert " 99% " in progress.line(clock[0])
