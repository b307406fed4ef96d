"""ServiceAccounts kept in memory, with the three calls an IRSA grant makes of the Kube client
(provisioner.access.grants): for running the grant code in process (its tests, bench/access.py)."""

from __future__ import annotations

import copy
from typing import Any


class MemoryServiceAccounts:
    def __init__(self) -> None:
        self.service_accounts: dict[tuple[str, str], dict[str, Any]] = {}

    def add_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        """A ServiceAccount as the API server would hold it; its metadata."""
        meta = {"name": name, "namespace": namespace, "resourceVersion": "1"}
        self.service_accounts[(namespace, name)] = {"metadata": meta}
        return meta

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.service_accounts.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def annotate_service_account(
        self, namespace: str, name: str, key: str, value: str, resource_version: str
    ) -> None:
        meta = self.service_accounts[(namespace, name)]["metadata"]
        assert meta["resourceVersion"] == resource_version, "annotated a stale version"
        meta.setdefault("annotations", {})[key] = value
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def remove_service_account_annotation(
        self, namespace: str, name: str, key: str, value: str
    ) -> bool:
        annotations = self.service_accounts[(namespace, name)]["metadata"].get("annotations", {})
        if annotations.get(key) != value:
            return False
        del annotations[key]
        return True
