"""Conversion between the served versions of the namespaced kinds: v1alpha1 and v1beta1.

v1beta1 is the hub: the storage version, the version the operator watches, and the one
the reconciler reads (`to_internal`). The conversion is lossless both ways: what v1alpha1
cannot express (a Secret template, a storage type or IOPS) travels in one annotation of the
v1alpha1 form, `cloud.provisioner.dev/v1beta1-fields`, and comes back from it.

The differences (docs/api.md, "v1beta1"):
- every kind: `spec.writeConnectionSecretToRef: {name}` became
  `spec.connectionSecret: {name, keys}` (keys: a template per Secret key);
- DatabaseInstance: `spec.allocatedStorageGiB` became `spec.storage: {sizeGiB, type, iops}`.

Status, metadata and every other spec field are the same in both versions and copied as
they are. The functions are pure and never mutate their argument.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from provisioner import GROUP

V1ALPHA1 = "v1alpha1"
V1BETA1 = "v1beta1"
SERVED = (V1ALPHA1, V1BETA1)
HUB = V1BETA1
# The kinds with two versions (CloudAccount, cluster-scoped, has v1alpha1 only).
KINDS = ("DatabaseInstance", "S3Bucket", "Queue", "Topic")
# On the v1alpha1 form: the v1beta1 fields v1alpha1 has no place for, as JSON.
FIELDS_ANNOTATION = f"{GROUP}/v1beta1-fields"


class ConversionError(ValueError):
    """An object that cannot be converted; the message is one line."""


def version_of(body: Mapping[str, Any]) -> str:
    api_version = str(body.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    if group != GROUP or version not in SERVED:
        raise ConversionError(f"apiVersion {api_version!r} is not one of {GROUP}/{SERVED}")
    return version


def convert(body: Mapping[str, Any], desired: str) -> dict[str, Any]:
    """`body` at `desired` (`v1alpha1`, `v1beta1` or `group/version`)."""
    desired = desired.rpartition("/")[2]
    if desired not in SERVED:
        raise ConversionError(f"cannot convert to {desired!r}: served are {', '.join(SERVED)}")
    current = version_of(body)
    out = copy.deepcopy(dict(body))
    if current == desired:
        return out
    if str(out.get("kind")) not in KINDS:
        raise ConversionError(f"kind {out.get('kind')!r} has no version {desired}")
    out = to_v1beta1(out) if desired == V1BETA1 else to_v1alpha1(out)
    out["apiVersion"] = f"{GROUP}/{desired}"
    return out


def to_internal(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as the reconciler reads it (v1beta1), whatever version it was written in.

    A body without apiVersion is read as v1alpha1, which changes nothing in a v1beta1 one.
    """
    if body.get("kind") not in KINDS:
        return dict(body)
    if not body.get("apiVersion"):
        return to_v1beta1(copy.deepcopy(dict(body)))
    return convert(body, HUB)


def to_v1beta1(out: dict[str, Any]) -> dict[str, Any]:
    """v1alpha1 -> v1beta1, in place on a copy."""
    spec = out.get("spec")
    meta = out.get("metadata")
    kept: dict[str, Any] = {}
    if isinstance(meta, dict) and FIELDS_ANNOTATION in (meta.get("annotations") or {}):
        annotations = dict(meta["annotations"])
        kept = _load(annotations.pop(FIELDS_ANNOTATION))
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations")
    if not isinstance(spec, dict):
        return out
    secret = _pop_dict(spec, "writeConnectionSecretToRef")
    kept_secret = kept.get("connectionSecret")
    if secret is not None or isinstance(kept_secret, dict):
        merged = dict(kept_secret) if isinstance(kept_secret, dict) else {}
        if secret is not None:
            merged.update(secret)
        spec["connectionSecret"] = merged
    if out.get("kind") == "DatabaseInstance":
        size = spec.pop("allocatedStorageGiB", None)
        kept_storage = kept.get("storage")
        if size is not None or isinstance(kept_storage, dict):
            storage = dict(kept_storage) if isinstance(kept_storage, dict) else {}
            if size is not None:
                storage["sizeGiB"] = size
            spec["storage"] = storage
    return out


def to_v1alpha1(out: dict[str, Any]) -> dict[str, Any]:
    """v1beta1 -> v1alpha1, in place on a copy; what v1alpha1 lacks goes to the annotation."""
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    kept: dict[str, Any] = {}
    secret = _pop_dict(spec, "connectionSecret")
    if secret is not None:
        named = "name" in secret
        if named:
            spec["writeConnectionSecretToRef"] = {"name": secret.pop("name")}
        if secret or not named:
            kept["connectionSecret"] = secret
    if out.get("kind") == "DatabaseInstance":
        storage = _pop_dict(spec, "storage")
        if storage is not None:
            sized = "sizeGiB" in storage
            if sized:
                spec["allocatedStorageGiB"] = storage.pop("sizeGiB")
            if storage or not sized:
                kept["storage"] = storage
    if kept:
        meta = out.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        annotations[FIELDS_ANNOTATION] = json.dumps(kept, sort_keys=True, separators=(",", ":"))
        meta["annotations"] = annotations
    return out


def _pop_dict(spec: dict[str, Any], key: str) -> dict[str, Any] | None:
    if key not in spec:
        return None
    value = spec.pop(key)
    if not isinstance(value, dict):
        raise ConversionError(f"spec.{key} must be an object, not {type(value).__name__}")
    return dict(value)


def _load(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(str(text))
    except ValueError:
        raise ConversionError(f"annotation {FIELDS_ANNOTATION} is not JSON") from None
    if not isinstance(value, dict):
        raise ConversionError(f"annotation {FIELDS_ANNOTATION} must hold a JSON object")
    return value


def review_response(review: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to an apiextensions.k8s.io/v1 ConversionReview.

    One object that fails fails the request (the API server's contract), with a message
    naming it; nothing of a spec's values is quoted.
    """
    request = review.get("request") or {}
    uid = request.get("uid", "")
    desired = str(request.get("desiredAPIVersion") or "")
    converted: list[dict[str, Any]] = []
    result: dict[str, Any] = {"status": "Success"}
    for obj in request.get("objects") or []:
        try:
            converted.append(convert(obj, desired))
        except ConversionError as exc:
            meta = obj.get("metadata") or {} if isinstance(obj, dict) else {}
            where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            result = {"status": "Failure", "message": f"{obj.get('kind')} {where}: {exc}"}
            converted = []
            break
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {"uid": uid, "convertedObjects": converted, "result": result},
    }


def essence_to_hub(essence: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A stored spec/metadata essence (kopf's last-handled configuration) at the hub.

    One written by an operator that watched v1alpha1 is converted; one already at the hub
    comes back unchanged (converting a hub form as if it were v1alpha1 changes nothing).
    """
    if kind not in KINDS:
        return dict(essence)
    body = {**essence, "apiVersion": f"{GROUP}/{V1ALPHA1}", "kind": kind}
    out = to_v1beta1(copy.deepcopy(body))
    return {k: v for k, v in out.items() if k not in ("apiVersion", "kind")}
