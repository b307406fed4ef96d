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

The API server checks an object written at v1alpha1 against v1alpha1's schema only, where the
annotation is a string like any other. So `convert` checks what it lifts out of the annotation
against v1beta1's rules (provisioner/model/v1beta1_rules.py) and refuses, with the rule's message,
what v1beta1 would refuse: the write fails as it would have at v1beta1.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from provisioner import GROUP
from provisioner.model import v1beta1_rules

V1ALPHA1 = "v1alpha1"
V1BETA1 = "v1beta1"
SERVED = (V1ALPHA1, V1BETA1)
HUB = V1BETA1
# The kinds with two versions (CloudAccount, cluster-scoped, has v1alpha1 only): those whose
# connection Secret v1beta1 describes.
KINDS = v1beta1_rules.KINDS
# On the v1alpha1 form: the v1beta1 fields v1alpha1 has no place for, as JSON.
FIELDS_ANNOTATION = f"{GROUP}/v1beta1-fields"
# The API server's limit on all of an object's annotations together (256 KiB): a longer
# annotation cannot come from an object it holds.
MAX_FIELDS_CHARS = 256 * 1024


class ConversionError(ValueError):
    """An object that cannot be converted; the message is one line."""


def version_of(body: Mapping[str, Any]) -> str:
    api_version = str(body.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    if group != GROUP or version not in SERVED:
        raise ConversionError(f"apiVersion {_brief(api_version)} is not one of {GROUP}/{SERVED}")
    return version


def convert(body: Mapping[str, Any], desired: str) -> dict[str, Any]:
    """`body` at `desired` (`v1alpha1`, `v1beta1` or `group/version`)."""
    desired = desired.rpartition("/")[2]
    if desired not in SERVED:
        served = ", ".join(SERVED)
        raise ConversionError(f"cannot convert to {_brief(desired)}: served are {served}")
    current = version_of(body)
    out = copy.deepcopy(dict(body))
    if current == desired:
        return out
    if out.get("kind") not in KINDS:
        raise ConversionError(f"kind {_brief(out.get('kind'))} has no version {desired}")
    out = to_v1beta1(out, checked=True) if desired == V1BETA1 else to_v1alpha1(out)
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


def to_v1beta1(out: dict[str, Any], *, checked: bool = False) -> dict[str, Any]:
    """v1alpha1 -> v1beta1, in place on a copy.

    `checked`: what the annotation holds must pass v1beta1's rules (ConversionError if not).
    """
    spec = out.get("spec")
    meta = out.get("metadata")
    kept: dict[str, Any] = {}
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if (
        isinstance(meta, dict)
        and isinstance(annotations, dict)
        and FIELDS_ANNOTATION in annotations
    ):
        annotations = dict(annotations)
        kept = _load(annotations.pop(FIELDS_ANNOTATION))
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations")
    if checked:
        _check_lifted(kept, out)
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
    if not isinstance(text, str):
        raise ConversionError(f"annotation {FIELDS_ANNOTATION} must be a string")
    if len(text) > MAX_FIELDS_CHARS:
        raise ConversionError(
            f"annotation {FIELDS_ANNOTATION} is longer than {MAX_FIELDS_CHARS} characters"
        )
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ConversionError(f"annotation {FIELDS_ANNOTATION} is not JSON") from None
    if not isinstance(value, dict):
        raise ConversionError(f"annotation {FIELDS_ANNOTATION} must hold a JSON object")
    return value


def _check_lifted(kept: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """What the annotation holds, lifted into `body` (v1alpha1), checked as v1beta1 would.

    The Secret's name and the storage size have fields at v1alpha1: the annotation may repeat
    them (what v1alpha1 spells is what is stored) but not contradict them, or the v1alpha1
    rules on those fields (immutable, may only grow) would not see what is stored.
    """
    where = f"annotation {FIELDS_ANNOTATION}"
    try:
        v1beta1_rules.check(kept, str(body.get("kind")), _mapping(body.get("spec")))
    except v1beta1_rules.RuleError as exc:
        raise ConversionError(f"{where}: {exc}") from None
    spec = _mapping(body.get("spec"))
    secret = _mapping(kept.get("connectionSecret"))
    if "name" in secret:
        ref = spec.get("writeConnectionSecretToRef")
        default = f"{_mapping(body.get('metadata')).get('name')}-connection"
        if secret["name"] != (ref.get("name") if isinstance(ref, dict) else default):
            raise ConversionError(
                f"{where}: spec.connectionSecret.name differs from"
                " spec.writeConnectionSecretToRef.name (<metadata.name>-connection when unset),"
                " where v1alpha1 sets it"
            )
    storage = _mapping(kept.get("storage"))
    if "sizeGiB" in storage and storage["sizeGiB"] != spec.get("allocatedStorageGiB"):
        raise ConversionError(
            f"{where}: spec.storage.sizeGiB differs from spec.allocatedStorageGiB,"
            " where v1alpha1 sets it"
        )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _brief(value: Any) -> str:
    """A value from the request, quoted, at most 100 characters, on one line."""
    if not isinstance(value, str):
        return f"of type {type(value).__name__}"
    return json.dumps(value[:100] + ("..." if len(value) > 100 else ""))


def review_response(review: Any) -> dict[str, Any]:
    """The answer to an apiextensions.k8s.io/v1 ConversionReview.

    One object that fails fails the request (the API server's contract), with a message
    naming it; nothing of a spec's values is quoted. Never raises: a review or an object that
    is not what the API server sends fails the same way, with a message saying what is wrong.
    """
    request = _mapping(_mapping(review).get("request"))
    result: dict[str, Any] = {"status": "Success"}
    try:
        if not request:
            raise ConversionError("not a ConversionReview: no request")
        converted = _convert_all(request)
    except ConversionError as exc:
        converted, result = [], {"status": "Failure", "message": str(exc)}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {
            "uid": request.get("uid", ""),
            "convertedObjects": converted,
            "result": result,
        },
    }


def _convert_all(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    desired = request.get("desiredAPIVersion") or ""
    objects = request.get("objects") or []
    if not isinstance(desired, str):
        raise ConversionError("request.desiredAPIVersion must be a string")
    if not isinstance(objects, list):
        raise ConversionError("request.objects must be a list")
    converted = []
    for obj in objects:
        if not isinstance(obj, dict):
            raise ConversionError("request.objects: an object must be a JSON object")
        try:
            converted.append(convert(obj, desired))
        except ConversionError as exc:
            raise ConversionError(f"{_named(obj)}: {exc}") from None
        except (TypeError, AttributeError, KeyError, ValueError, RecursionError):
            raise ConversionError(f"{_named(obj)}: not an object of this API") from None
    return converted


# A kind, namespace or name as the API server spells them; anything else is not quoted.
_PLAIN = re.compile(r"[-.:A-Za-z0-9_]{0,253}")


def _named(obj: Mapping[str, Any]) -> str:
    meta = _mapping(obj.get("metadata"))
    kind, namespace, name = (
        value if isinstance(value, str) and _PLAIN.fullmatch(value) else "?"
        for value in (obj.get("kind"), meta.get("namespace", ""), meta.get("name", ""))
    )
    return f"{kind} {namespace}/{name}"


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
