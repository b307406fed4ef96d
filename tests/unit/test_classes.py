"""ResourceClasses in the reconciler's terms: which class a resource uses, the effective spec
it gets, the enforced fields, what a class change requests, the defaults' check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from provisioner.model import conditions as cond
from provisioner.model import schema_defaults, spec_check
from provisioner.model.classes import (
    ClassRefused,
    ClassUse,
    ResourceClass,
    changed_fields,
    effective_spec,
    violations,
)
from provisioner.placement.classes import Classes, class_users
from provisioner_dev.crds import CRD_DIR


@pytest.fixture(autouse=True)
def installed_schemas() -> Iterator[None]:
    for path in CRD_DIR.glob("*.yaml"):
        schema_defaults.remember(yaml.safe_load(path.read_text()), "v1beta1")
    yield
    schema_defaults.forget()


def a_class(name: str = "prod-postgres", **spec: Any) -> dict[str, Any]:
    body = {
        "kind": "DatabaseInstance",
        "default": True,
        "namespaceSelector": {"matchLabels": {"env": "prod"}},
        "defaults": {
            "network": {"subnetGroupName": "private-db"},
            "encryption": {"kmsKeyId": "alias/rds-prod"},
            "deletionProtection": True,
            "backupRetentionDays": 14,
        },
        "enforced": ["network", "encryption", "deletionProtection"],
        "tags": {"cost-center": "4711"},
        **spec,
    }
    return {"metadata": {"name": name, "generation": 3}, "spec": body}


def database(namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cloud.provisioner.dev/v1beta1",
        "kind": "DatabaseInstance",
        "metadata": {"name": "orders", "namespace": namespace, "uid": "u1", "generation": 1},
        # As the API server serves it: with its schema defaults.
        "spec": schema_defaults.spec_with_defaults(
            "DatabaseInstance", {"engine": "postgres", "instanceClass": "db.t3.micro", **spec}
        ),
    }


LABELS = {"shop": {"env": "prod"}, "dev": {"env": "dev"}}


def directory(*bodies: dict[str, Any]) -> Classes:
    return Classes(lambda: list(bodies), lambda ns: LABELS.get(ns, {}))


def test_a_bare_resource_gets_what_it_leaves_unset_and_at_schema_default():
    spec, use = effective_spec(
        "DatabaseInstance",
        database(tags={"team": "shop"})["spec"],
        ResourceClass.from_body(a_class()),
    )
    assert spec["network"] == {"subnetGroupName": "private-db"}
    # The class's value, with the schema's defaults beneath it.
    assert spec["encryption"] == {"kmsKeyId": "alias/rds-prod", "enabled": True}
    assert spec["deletionProtection"] is True and spec["backupRetentionDays"] == 14
    assert spec["tags"] == {"cost-center": "4711", "team": "shop"}
    assert use.fields == ("network", "encryption", "deletionProtection", "backupRetentionDays")
    assert use.tag_keys == ("cost-center",)
    assert use.names("spec.network.subnetGroupName") and not use.names("spec.engine")


def test_what_the_resource_sets_wins_and_its_own_tags_win():
    spec, use = effective_spec(
        "DatabaseInstance",
        database(backupRetentionDays=3, tags={"cost-center": "mine"})["spec"],
        ResourceClass.from_body(a_class()),
    )
    assert spec["backupRetentionDays"] == 3
    assert spec["tags"] == {"cost-center": "mine"}
    assert "backupRetentionDays" not in use.fields and use.tag_keys == ()


def test_enforced_fields_set_otherwise_are_named_and_the_same_value_passes():
    cls = ResourceClass.from_body(a_class())
    other = database(network={"subnetGroupName": "public"}, deletionProtection=True)["spec"]
    assert violations("DatabaseInstance", other, cls) == ["network"]
    same = database(network={"subnetGroupName": "private-db"})["spec"]
    assert violations("DatabaseInstance", same, cls) == []
    # An enforced field without a default may not be set at all.
    bare = ResourceClass.from_body(a_class(enforced=["port"]))
    assert violations("DatabaseInstance", database(port=5433)["spec"], bare) == ["port"]


def test_the_default_class_of_the_namespace_applies_and_refusals_name_why():
    prod = a_class()
    classes = directory(prod)
    hub, use = classes.apply(database())
    assert use is not None and use.name == "prod-postgres" and use.generation == 3
    assert hub["spec"]["network"] == {"subnetGroupName": "private-db"}
    # Not selected: no default class, and a named one is not allowed.
    assert classes.apply(database("dev"))[1] is None
    with pytest.raises(ClassRefused) as refused:
        classes.apply(database("dev", className="prod-postgres"))
    assert refused.value.reason == cond.CLASS_NOT_ALLOWED
    assert "does not select namespace dev" in refused.value.message
    with pytest.raises(ClassRefused) as refused:
        classes.apply(database(className="nope"))
    assert refused.value.reason == cond.CLASS_NOT_FOUND
    with pytest.raises(ClassRefused) as refused:
        classes.apply(database(network={"subnetGroupName": "public"}))
    assert refused.value.reason == cond.INVALID_SPEC
    assert refused.value.message == "spec.network is set by ResourceClass prod-postgres"


def test_two_defaults_for_one_namespace_are_ambiguous_and_a_queue_class_is_not_a_database():
    classes = directory(a_class(), a_class("also-prod"))
    with pytest.raises(ClassRefused) as refused:
        classes.apply(database())
    assert refused.value.reason == cond.AMBIGUOUS_CLASS
    assert "also-prod and prod-postgres" in refused.value.message
    queues = directory(a_class("queues", kind="Queue", defaults={}, enforced=[]))
    with pytest.raises(ClassRefused) as refused:
        queues.apply(database(className="queues"))
    assert refused.value.reason == cond.INVALID_SPEC and "is for Queue" in refused.value.message


def test_a_class_being_deleted_serves_only_those_that_used_it():
    deleting = a_class()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    classes = directory(deleting)
    assert classes.apply(database())[1] is None
    used = database()
    used["status"] = {"class": {"name": "prod-postgres"}}
    assert classes.apply(used)[1] is not None


def test_the_watch_feeds_the_directory_after_one_listing():
    listed = []
    classes = Classes(lambda: listed.append(1) or [], lambda ns: LABELS.get(ns, {}))
    assert classes.apply(database())[1] is None
    classes.class_seen(a_class())
    assert classes.apply(database())[1] is not None
    classes.class_gone("prod-postgres")
    assert classes.apply(database())[1] is None
    assert listed == [1]


def test_a_class_edit_requests_only_the_fields_whose_value_changed():
    before = ResourceClass.from_body(a_class())
    _, used = effective_spec("DatabaseInstance", database()["spec"], before)
    edited = a_class(
        defaults={**a_class()["spec"]["defaults"], "backupRetentionDays": 21},
        tags={"cost-center": "4712"},
    )
    _, now = effective_spec("DatabaseInstance", database()["spec"], ResourceClass.from_body(edited))
    assert changed_fields(used.status, now) == {"spec.backupRetentionDays", "spec.tags"}
    # Another class (or none before): everything it sets.
    assert changed_fields({}, now) == {f"spec.{f}" for f in now.digests}
    assert changed_fields(used.status, used) == frozenset()


def test_defaults_are_checked_against_the_kinds_schema_at_every_depth():
    assert spec_check.problems("DatabaseInstance", a_class()["spec"]["defaults"]) == []
    found = spec_check.problems(
        "DatabaseInstance",
        {"network": {"subnetGroupNam": "x"}, "backupRetentionDays": "two", "colour": "red"},
    )
    assert found is not None
    assert found[0] == "spec.defaults.colour: DatabaseInstance has no such field"
    joined = " ".join(found)
    assert "spec.defaults.network: Additional properties" in joined and "subnetGroupNam" in joined
    assert "spec.defaults.backupRetentionDays: 'two' is not of type 'integer'" in joined


def test_the_users_of_a_class_are_those_that_name_it_or_used_it():
    items = [
        {"kind": "Queue", "metadata": {"namespace": "a", "name": "q"}, "spec": {"className": "c"}},
        {
            "kind": "Topic",
            "metadata": {"namespace": "b", "name": "t"},
            "spec": {},
            "status": {"class": {"name": "c"}},
        },
        {"kind": "Topic", "metadata": {"namespace": "b", "name": "u"}, "spec": {}},
    ]
    assert class_users("c", items) == ["a/Queue/q", "b/Topic/t"]


def test_a_class_use_reports_its_status():
    use = ClassUse("c", 4, ("network",), (), {"network": "abc"})
    assert use.status == {"name": "c", "generation": 4, "fields": {"network": "abc"}}
