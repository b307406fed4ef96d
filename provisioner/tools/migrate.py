"""`provisioner migrate-storage`: every object of the operator's CRDs stored at the storage
version, so that older versions can leave the CRDs' `status.storedVersions` (and, one release
later, the CRDs).

For each CRD, in this order:
1. every object, listed at the storage version, is written back unchanged: the API server
   stores what it is given at the storage version (an object stored at it already is left as
   it is: an unchanged write is no write);
2. connection Secrets (label `app.kubernetes.io/managed-by=provisioner`, every namespace)
   whose ownerReference names the kind at another version of the group get it at the storage
   version (nothing else in them changes);
3. only then, `status.storedVersions` of the CRD becomes `[<storage version>]`.

Run again at any time: an interrupted run leaves storedVersions as it was, and the next one
finishes; a run after a finished one writes nothing that changes and says the same.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from provisioner import GROUP
from provisioner.crashpoints import crashpoint
from provisioner.kinds.registry import KINDS
from provisioner.kube import login as kubelogin
from provisioner.kube.client import Kube, KubeError

CRDS: tuple[str, ...] = tuple(f"{k.plural}.{GROUP}" for k in KINDS)
MANAGED_BY_SELECTOR = "app.kubernetes.io/managed-by=provisioner"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PAGE_SIZE = 250
# Writes of one object that meet a conflict (someone else wrote it since it was read) are
# tried again on a fresh read, this many times in all.
ATTEMPTS = 10


class MigrationError(RuntimeError):
    """What stopped the migration, in one line."""


@dataclass(frozen=True)
class Outcome:
    crd: str
    version: str  # the storage version
    objects: int  # written back
    secrets: int  # ownerReference rewritten
    stored: list[str]  # status.storedVersions now
    was: list[str]  # status.storedVersions before


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _versions(versions: list[str]) -> str:
    return "[" + ", ".join(versions) + "]"


def report_line(outcome: Outcome) -> str:
    """The one line printed for a migrated CRD."""
    return (
        f"{outcome.crd}: {_plural(outcome.objects, 'object')} rewritten at {outcome.version}, "
        f"{_plural(outcome.secrets, 'Secret')} updated, storedVersions "
        f"{_versions(outcome.stored)} (was {_versions(outcome.was)})"
    )


def resolve_names(names: list[str] | None) -> list[str]:
    """The CRDs asked for (full names or plurals), in the given order; all by default."""
    if not names:
        return list(CRDS)
    resolved: list[str] = []
    for name in names:
        full = name if "." in name else f"{name}.{GROUP}"
        if full not in CRDS:
            raise MigrationError(f"unknown CRD {name!r}: one of {', '.join(CRDS)}")
        if full not in resolved:
            resolved.append(full)
    return resolved


def storage_version(crd: dict[str, Any]) -> str:
    name = crd.get("metadata", {}).get("name", "?")
    stored = [v["name"] for v in crd.get("spec", {}).get("versions") or [] if v.get("storage")]
    if len(stored) != 1:
        raise MigrationError(f"{name}: no single storage version in spec.versions")
    return str(stored[0])


def rewritten_owner_references(
    secret: dict[str, Any], group: str, kind: str, version: str
) -> list[dict[str, Any]] | None:
    """The Secret's ownerReferences with every reference to `kind` of `group` at a version
    other than `version` moved to `version`; None when none needs it (the Secret is left
    alone). Nothing else in a reference changes: its uid names the same object at every
    version."""
    refs = secret.get("metadata", {}).get("ownerReferences") or []
    changed = False
    out: list[dict[str, Any]] = []
    for ref in refs:
        ref_group, _, ref_version = str(ref.get("apiVersion") or "").rpartition("/")
        if ref_group == group and ref.get("kind") == kind and ref_version != version:
            ref = {**ref, "apiVersion": f"{group}/{version}"}
            changed = True
        out.append(ref)
    return out if changed else None


class Migration:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    # -- reading ------------------------------------------------------------------------------

    def _list(self, path: str, selector: str | None = None) -> Iterator[dict[str, Any]]:
        """Every item at `path`, page by page. When the continue token expired (410), the
        listing starts again: the caller skips what it has done."""
        token = ""
        while True:
            query = [("limit", str(PAGE_SIZE))]
            if selector:
                query.append(("labelSelector", selector))
            if token:
                query.append(("continue", token))
            try:
                page = self.kube.request("GET", path, query=query)
            except KubeError as exc:
                if exc.status == 410 and token:
                    token = ""
                    continue
                raise
            if page is None:
                raise MigrationError(f"{path}: not found")
            yield from page.get("items") or []
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    def crd(self, name: str) -> dict[str, Any]:
        crd = self.kube.request("GET", f"{CRD_API}/{name}")
        if crd is None:
            raise MigrationError(f"CRD {name} not found: apply the CRDs first")
        return crd

    # -- writing ------------------------------------------------------------------------------

    def _write_back(
        self, path: str, body: dict[str, Any], fix: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """PUT `body` (after `fix(body)`, which says whether anything is left to write) at
        `path`; on a conflict, read it again and try again. False when it is gone or needs
        nothing any more."""
        for _ in range(ATTEMPTS):
            if not fix(body):
                return False
            try:
                return self.kube.request("PUT", path, body) is not None
            except KubeError as exc:
                if exc.status != 409:
                    raise
            fresh = self.kube.request("GET", path)
            if fresh is None:
                return False
            body = fresh
        raise MigrationError(f"{path}: still conflicting after {ATTEMPTS} attempts; run again")

    def objects(self, plural: str, kind: str, version: str) -> int:
        """Every object written back at `version`; how many were."""
        base = f"/apis/{GROUP}/{version}"
        done: set[tuple[str, str]] = set()
        written = 0

        def fix(body: dict[str, Any]) -> bool:
            # Items of a list may lack them; a write needs them.
            body["apiVersion"] = f"{GROUP}/{version}"
            body["kind"] = kind
            return True

        for item in self._list(f"{base}/{plural}"):
            meta = item.get("metadata") or {}
            key = (str(meta.get("namespace") or ""), str(meta.get("name")))
            if key in done:
                continue
            done.add(key)
            ns = f"/namespaces/{key[0]}" if key[0] else ""
            if self._write_back(f"{base}{ns}/{plural}/{key[1]}", item, fix):
                written += 1
                crashpoint("migrate-after-object")
        return written

    def secrets(self, kind: str, version: str) -> int:
        """Connection Secrets owned by `kind` at another version moved to `version`."""
        done: set[tuple[str, str]] = set()
        updated = 0

        def fix(body: dict[str, Any]) -> bool:
            refs = rewritten_owner_references(body, GROUP, kind, version)
            if refs is None:
                return False
            body["apiVersion"] = "v1"
            body["kind"] = "Secret"
            body["metadata"]["ownerReferences"] = refs
            return True

        for secret in self._list("/api/v1/secrets", MANAGED_BY_SELECTOR):
            meta = secret.get("metadata") or {}
            key = (str(meta.get("namespace")), str(meta.get("name")))
            if key in done or rewritten_owner_references(secret, GROUP, kind, version) is None:
                continue
            done.add(key)
            path = f"/api/v1/namespaces/{key[0]}/secrets/{key[1]}"
            if self._write_back(path, secret, fix):
                updated += 1
        return updated

    def set_stored_versions(self, name: str, version: str) -> list[str]:
        """status.storedVersions = [version], unless the storage version changed meanwhile."""
        path = f"{CRD_API}/{name}"
        for _ in range(ATTEMPTS):
            crd = self.crd(name)
            now = storage_version(crd)
            if now != version:
                raise MigrationError(
                    f"{name}: the storage version changed from {version} to {now} during "
                    "the migration; run again"
                )
            crd.setdefault("status", {})["storedVersions"] = [version]
            try:
                done = self.kube.request("PUT", f"{path}/status", crd)
            except KubeError as exc:
                if exc.status != 409:  # the CRD changed since it was read (a new caBundle)
                    raise
                continue
            if done is None:
                raise MigrationError(f"CRD {name} was deleted during the migration")
            return list((done.get("status") or {}).get("storedVersions") or [version])
        raise MigrationError(f"{name}: status still conflicting after {ATTEMPTS} attempts")

    # -- one CRD ------------------------------------------------------------------------------

    def migrate(self, name: str) -> Outcome:
        crd = self.crd(name)
        version = storage_version(crd)
        was = list((crd.get("status") or {}).get("storedVersions") or [])
        names = crd["spec"]["names"]
        step = "rewriting its objects"
        try:
            objects = self.objects(names["plural"], names["kind"], version)
            step = "updating connection Secrets"
            secrets = self.secrets(names["kind"], version)
            step = "setting status.storedVersions"
            stored = self.set_stored_versions(name, version)
        except KubeError as exc:
            hint = ""
            if "conversion webhook" in exc.message:
                hint = " (the operator serves the conversions: is it running?)"
            raise MigrationError(f"{name}: {step} at {version}: {exc}{hint}") from None
        return Outcome(name, version, objects, secrets, stored, was)


def login(kubeconfig: str | None) -> kubelogin.Credentials:
    """The credentials of `kubeconfig` (files joined as in $KUBECONFIG) when given, else as
    the operator finds its own (a pod's ServiceAccount, $KUBECONFIG, ~/.kube/config)."""
    if not kubeconfig:
        return kubelogin.login()
    paths = [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p]
    missing = [str(p) for p in paths if not p.exists()]
    if missing or not paths:
        raise kubelogin.LoginError(f"no kubeconfig at {', '.join(missing) or repr(kubeconfig)}")
    creds = kubelogin.from_kubeconfig(paths)
    if creds is None:  # pragma: no cover - paths exist
        raise kubelogin.LoginError(f"no kubeconfig at {kubeconfig}")
    return creds


def main(kubeconfig: str | None, names: list[str] | None) -> int:
    """Migrate the CRDs `names` (all by default), one line each on stdout; 1 and one line on
    stderr at the first error."""
    try:
        crds = resolve_names(names)
        migration = Migration(Kube(pool_size=4, creds=login(kubeconfig)))
        for name in crds:
            print(report_line(migration.migrate(name)), flush=True)
    except (MigrationError, KubeError, kubelogin.LoginError) as exc:
        return _fail(str(exc))
    except urllib3.exceptions.HTTPError as exc:
        return _fail(f"cannot reach the API server: {exc}")
    except OSError as exc:  # a certificate or key file named by the kubeconfig
        return _fail(str(exc))
    return 0


def _fail(message: str) -> int:
    print(f"provisioner migrate-storage: {message}", file=sys.stderr, flush=True)
    return 1
