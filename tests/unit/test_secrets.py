"""provisioner.model.connection_secret: passwords, URIs, the body, and when to (re)write it."""

from __future__ import annotations

import base64
import copy
import re
import string
from urllib.parse import unquote, urlsplit

import pytest

from provisioner import API_VERSION
from provisioner.kinds import registry as kinds
from provisioner.model import connection_secret as secrets

UID = "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"


def make_resource(kind="DatabaseInstance", uid=UID, secret_ref=None):
    spec = {
        "DatabaseInstance": {"engine": "postgres", "instanceClass": "db.t3.micro"},
        "S3Bucket": {},
        "Queue": {},
    }[kind]
    if secret_ref:
        spec = {**spec, "writeConnectionSecretToRef": {"name": secret_ref}}
    body = {
        "kind": kind,
        "metadata": {"namespace": "team-a", "name": "orders", "uid": uid, "generation": 2},
        "spec": spec,
    }
    return kinds.parse(body, region="eu-west-1", cluster_id="c1")


DATA = {"host": "db.example", "port": "5432", "username": "app", "password": "pw123"}


# -- passwords -----------------------------------------------------------------------


def test_generate_password_length_and_alphabet():
    allowed = set(string.ascii_letters + string.digits)
    for _ in range(50):
        password = secrets.generate_password()
        assert len(password) >= 24
        assert set(password) <= allowed


def test_generate_password_custom_length():
    assert len(secrets.generate_password(40)) == 40


def test_generate_password_calls_differ():
    passwords = {secrets.generate_password() for _ in range(20)}
    assert len(passwords) == 20


# -- database_uri ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "scheme"),
    [("postgres", "postgresql"), ("mysql", "mysql"), ("mariadb", "mysql")],
)
def test_database_uri_scheme(engine, scheme):
    uri = secrets.database_uri(engine, "app", "pw", "h.example", "3306", "main")
    assert uri == f"{scheme}://app:pw@h.example:3306/main"


@pytest.mark.parametrize(
    "username", ["us@er", "a:b", "sl/ash", "p%ct", "sp ace", "q?x#y", "üñí", "x+y&z=1"]
)
def test_database_uri_escapes_odd_usernames(username):
    password = "P4ss:w@rd/?#"
    uri = secrets.database_uri("postgres", username, password, "h.example", "5432", "db")
    parts = urlsplit(uri)
    assert parts.scheme == "postgresql"
    assert parts.hostname == "h.example"
    assert parts.port == 5432
    assert parts.path == "/db"
    assert unquote(parts.username) == username
    assert unquote(parts.password) == password
    userinfo = uri.split("://", 1)[1].rsplit("@", 1)[0]
    assert userinfo.count(":") == 1
    assert "@" not in userinfo
    assert "/" not in userinfo


# -- build ------------------------------------------------------------------------


def test_build_owner_reference_labels_annotation_and_data():
    resource = make_resource()
    body = secrets.build(resource, DATA)
    assert body["apiVersion"] == "v1"
    assert body["kind"] == "Secret"
    meta = body["metadata"]
    assert meta["name"] == "orders-connection"
    assert meta["namespace"] == "team-a"
    (ref,) = meta["ownerReferences"]
    assert ref["uid"] == UID
    assert ref["controller"] is True
    assert ref["blockOwnerDeletion"] is True
    assert ref["kind"] == "DatabaseInstance"
    assert ref["name"] == "orders"
    assert ref["apiVersion"] == API_VERSION
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "provisioner",
        "cloud.provisioner.dev/owner-kind": "DatabaseInstance",
        "cloud.provisioner.dev/owner-name": "orders",
    }
    assert meta["annotations"][secrets.HASH_ANNOTATION] == secrets.content_hash(DATA)
    assert re.fullmatch(r"[0-9a-f]{64}", meta["annotations"][secrets.HASH_ANNOTATION])
    assert set(body["data"]) == set(DATA)
    for key, value in DATA.items():
        assert base64.b64decode(body["data"][key]).decode() == value
    assert secrets.decode(body) == DATA


def test_build_uses_custom_secret_name_and_non_ascii_values():
    resource = make_resource("S3Bucket", secret_ref="my-bucket-secret")
    data = {"bucket": "b", "note": "ünïcödé"}
    body = secrets.build(resource, data)
    assert body["metadata"]["name"] == "my-bucket-secret"
    assert body["metadata"]["labels"]["cloud.provisioner.dev/owner-kind"] == "S3Bucket"
    assert secrets.decode(body) == data


def test_content_hash_ignores_key_order_but_not_values():
    assert secrets.content_hash({"a": "1", "b": "2"}) == secrets.content_hash({"b": "2", "a": "1"})
    assert secrets.content_hash({"a": "1"}) != secrets.content_hash({"a": "2"})


# -- owned_by / needs_write ---------------------------------------------------------


def existing_for(resource, data, resource_version="7"):
    body = secrets.build(resource, data)
    body["metadata"]["resourceVersion"] = resource_version
    body["metadata"]["uid"] = "secret-uid"
    return body


def test_needs_write_when_missing():
    assert secrets.needs_write(None, make_resource(), DATA) is True


def test_needs_write_false_for_same_content():
    resource = make_resource()
    assert secrets.needs_write(existing_for(resource, DATA), resource, dict(DATA)) is False


def test_needs_write_true_when_content_changes():
    resource = make_resource()
    existing = existing_for(resource, DATA)
    assert secrets.needs_write(existing, resource, {**DATA, "host": "other"}) is True
    assert secrets.needs_write(existing, resource, {**DATA, "extra": "x"}) is True


def test_needs_write_true_when_value_edited_behind_unchanged_hash():
    resource = make_resource()
    existing = existing_for(resource, DATA)
    existing["data"]["password"] = base64.b64encode(b"tampered").decode()
    assert existing["metadata"]["annotations"][secrets.HASH_ANNOTATION] == (
        secrets.content_hash(DATA)
    )
    assert secrets.needs_write(existing, resource, DATA) is True


def test_needs_write_true_when_key_added_or_removed_behind_unchanged_hash():
    resource = make_resource()
    added = existing_for(resource, DATA)
    added["data"]["rogue"] = base64.b64encode(b"x").decode()
    assert secrets.needs_write(added, resource, DATA) is True
    removed = existing_for(resource, DATA)
    del removed["data"]["host"]
    assert secrets.needs_write(removed, resource, DATA) is True


def test_needs_write_true_when_hash_annotation_missing():
    resource = make_resource()
    existing = existing_for(resource, DATA)
    existing["metadata"]["annotations"] = None
    assert secrets.needs_write(existing, resource, DATA) is True


def test_needs_write_does_not_mutate_inputs():
    resource = make_resource()
    existing = existing_for(resource, DATA)
    snapshot = copy.deepcopy(existing)
    secrets.needs_write(existing, resource, DATA)
    assert existing == snapshot


@pytest.mark.parametrize(
    "refs",
    [
        None,
        [],
        [{"apiVersion": API_VERSION, "kind": "DatabaseInstance", "name": "orders", "uid": "x"}],
        [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "other-uid"}],
    ],
)
def test_needs_write_raises_for_foreign_secret(refs):
    resource = make_resource()
    existing = existing_for(resource, DATA)
    if refs is None:
        del existing["metadata"]["ownerReferences"]
    else:
        existing["metadata"]["ownerReferences"] = refs
    with pytest.raises(secrets.SecretConflict) as info:
        secrets.needs_write(existing, resource, DATA)
    assert "orders-connection" in str(info.value)
    assert not secrets.owned_by(existing, resource)


def test_secret_of_same_name_from_a_previous_incarnation_is_foreign():
    old = make_resource(uid="old-uid")
    new = make_resource(uid="new-uid")
    existing = existing_for(old, DATA)
    assert secrets.owned_by(existing, old)
    with pytest.raises(secrets.SecretConflict):
        secrets.needs_write(existing, new, DATA)


def test_owned_by_any_of_several_owner_references():
    resource = make_resource()
    existing = existing_for(resource, DATA)
    existing["metadata"]["ownerReferences"].insert(0, {"uid": "someone-else"})
    assert secrets.owned_by(existing, resource)
    assert secrets.needs_write(existing, resource, DATA) is False


def test_decode_handles_missing_data():
    assert secrets.decode({}) == {}
    assert secrets.decode({"data": None}) == {}
