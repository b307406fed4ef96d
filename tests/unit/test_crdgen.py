"""The two versions of the namespaced CRDs: v1beta1 is v1alpha1 but for the listed changes.

crds/*.yaml are written by provisioner_dev/crdgen.py; these tests fail when a file was edited
without it, and check its output on the parsed YAML (not on the text it works on).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner_dev import crdgen

ROOT = Path(__file__).resolve().parents[2]
KINDS = sorted(crdgen.FILES)


def load(kind: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "crds" / crdgen.FILES[kind]).read_text())


def versions(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in crd["spec"]["versions"]}


def test_the_files_are_what_the_generator_writes():
    assert crdgen.stale() == [], "run: python -m provisioner_dev.crdgen"
    assert crdgen.main(["--check"]) == 0


def test_every_namespaced_crd_is_covered_and_cloudaccounts_is_left_alone():
    namespaced = {
        crd["spec"]["names"]["kind"]
        for crd in (yaml.safe_load(p.read_text()) for p in (ROOT / "crds").glob("*.yaml"))
        if crd["spec"]["scope"] == "Namespaced"
    }
    assert namespaced == set(crdgen.FILES)
    accounts = yaml.safe_load((ROOT / "crds" / "cloudaccounts.yaml").read_text())
    assert [v["name"] for v in accounts["spec"]["versions"]] == ["v1alpha1"]
    assert "conversion" not in accounts["spec"]


@pytest.mark.parametrize("kind", KINDS)
def test_both_served_v1beta1_stored_converted_by_the_webhook(kind):
    crd = load(kind)
    got = versions(crd)
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1", "v1beta1"]
    assert got["v1alpha1"]["served"] and got["v1beta1"]["served"]
    assert (got["v1alpha1"]["storage"], got["v1beta1"]["storage"]) == (False, True)
    assert crd["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {
                    "namespace": "provisioner-system",
                    "name": "provisioner-webhook",
                    "port": 9443,
                    "path": "/convert",
                }
            },
        },
    }


def _without_changes(version: dict[str, Any]) -> dict[str, Any]:
    """The version entry without its name, storage flag and the fields v1beta1 changed."""
    out = copy.deepcopy(version)
    for key in ("name", "storage"):
        out.pop(key)
    schema = out["schema"]["openAPIV3Schema"]
    schema["x-kubernetes-validations"] = [
        r for r in schema["x-kubernetes-validations"] if "connection" not in r["rule"]
    ]
    spec = schema["properties"]["spec"]
    # v1beta1's own rules on the spec as a whole (the templates and who keeps the password).
    spec["x-kubernetes-validations"] = [
        r for r in spec.get("x-kubernetes-validations") or [] if "connectionSecret" not in r["rule"]
    ]
    for field in ("writeConnectionSecretToRef", "connectionSecret", "allocatedStorageGiB"):
        schema["properties"]["spec"]["properties"].pop(field, None)
    schema["properties"]["spec"]["properties"].pop("storage", None)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_v1beta1_differs_from_v1alpha1_only_where_the_design_says(kind):
    got = versions(load(kind))
    old, new = got["v1alpha1"], got["v1beta1"]
    assert _without_changes(old) == _without_changes(new)
    old_spec = old["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    new_spec = new["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "writeConnectionSecretToRef" in old_spec and "connectionSecret" not in old_spec
    assert "connectionSecret" in new_spec and "writeConnectionSecretToRef" not in new_spec
    # The Secret's name: same shape as before, now optional beside the templates.
    old_name = old_spec["writeConnectionSecretToRef"]["properties"]["name"]
    new_name = dict(new_spec["connectionSecret"]["properties"]["name"])
    new_name.pop("description")
    assert new_name == old_name
    assert "required" not in new_spec["connectionSecret"]
    if kind == "DatabaseInstance":
        assert "allocatedStorageGiB" not in new_spec
        size = dict(new_spec["storage"]["properties"]["sizeGiB"])
        alpha = dict(old_spec["allocatedStorageGiB"])
        assert size.pop("x-kubernetes-validations") == [
            {"rule": "self >= oldSelf", "message": "spec.storage.sizeGiB may grow but never shrink"}
        ]
        alpha.pop("x-kubernetes-validations")
        assert size == alpha
        assert new_spec["storage"]["default"] == {}
        assert new_spec["storage"]["properties"]["type"]["enum"] == [
            "gp2",
            "gp3",
            "io1",
            "io2",
            "standard",
        ]
        assert "default" not in new_spec["storage"]["properties"]["type"]
        assert "default" not in new_spec["storage"]["properties"]["iops"]
    else:
        assert "storage" not in new_spec
    assert "allocatedStorageGiB" not in str(new["additionalPrinterColumns"])


def _template_rule(kind: str) -> dict[str, str]:
    """The rule of spec.connectionSecret.keys that checks the templates' placeholders."""
    new = versions(load(kind))["v1beta1"]
    spec = new["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rules = spec["connectionSecret"]["properties"]["keys"]["x-kubernetes-validations"]
    (rule,) = [r for r in rules if r["rule"].startswith("self.all(k, self[k].matches(")]
    return rule


def _regex(rule: str) -> re.Pattern[str]:
    """The regular expression in a CEL `matches('...')`, its string escapes undone."""
    (literal,) = re.findall(r"matches\('((?:[^'\\]|\\.)*)'\)", rule)
    return re.compile(literal.encode().decode("unicode_escape"))


@pytest.mark.parametrize("kind", KINDS)
def test_templates_may_name_exactly_the_kinds_values(kind):
    """The template rule, read as a regular expression (RE2 and Python agree on it)."""
    rule = _template_rule(kind)
    pattern = _regex(rule["rule"])
    values = crdgen.VALUES[kind]
    for value in values:
        for template in (f"{{{{ .{value} }}}}", f"x-{{{{.{value}}}}}:{{{{  .{value}  }}}}"):
            assert pattern.fullmatch(template), template
    assert pattern.fullmatch("plain text, no placeholder")
    others = [v for other in crdgen.VALUES.values() for v in other if v not in values]
    for bad in [*(f"{{{{ .{v} }}}}" for v in others), "{{ .nothing }}", "{ .x }", "{{ x }}"]:
        assert not pattern.fullmatch(bad), bad
    assert rule["message"] == "spec.connectionSecret.keys: a template may name only " + ", ".join(
        f"{{{{ .{v} }}}}" for v in values
    )


def test_the_generator_refuses_a_file_it_does_not_understand(tmp_path):
    text = (ROOT / "crds" / "s3buckets.yaml").read_text()
    with pytest.raises(crdgen.CrdGenError, match=r"the Secret name's rule"):
        crdgen.render(text.replace("writeConnectionSecretToRef", "secretRef"), "S3Bucket")
    with pytest.raises(crdgen.CrdGenError, match="v1alpha1"):
        crdgen.render(text.replace("- name: v1alpha1", "- name: v1"), "S3Bucket")
