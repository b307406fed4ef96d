"""Every custom resource of every kind the operator serves, across namespaces."""

from __future__ import annotations

from typing import Any

from provisioner import API_VERSION
from provisioner.kinds.registry import PLURALS
from provisioner.kube.client import Kube


def custom_resources(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for kind, plural in PLURALS.items():
        listing = kube.request("GET", f"/apis/{API_VERSION}/{plural}") or {}
        for item in listing.get("items", []):
            item.setdefault("kind", kind)
            items.append(item)
    return items
