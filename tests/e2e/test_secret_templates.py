"""Connection Secret templates (v1beta1 `spec.connectionSecret.keys`), as an app team uses them.

An app-style Secret (DATABASE_URL and the PG* variables libpq reads) beside the default one,
a template change that rewrites the Secret once and keeps the password, and templates the
API server refuses at apply time.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from tests.helpers import (
    apply,
    assert_refused,
    events,
    get,
    merge_patch,
    secret_data,
    try_apply,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.e2e

APP_KEYS = {
    "DATABASE_URL": "{{ .uri }}",
    "PGHOST": "{{ .host }}",
    "PGPORT": "{{ .port }}",
    "PGUSER": "{{ .username }}",
    "PGPASSWORD": "{{ .password }}",
    "PGDATABASE": "{{.database}}",
}
DEFAULT_KEYS = {"host", "port", "username", "password", "database", "engine", "uri", "arn"}


def database(name: str, connection_secret: dict | None = None) -> str:
    spec: dict[str, object] = {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "databaseName": "orders",
        "deletionPolicy": "Delete",
    }
    if connection_secret is not None:
        spec["connectionSecret"] = connection_secret
    return json.dumps(
        {
            "apiVersion": "cloud.provisioner.dev/v1beta1",
            "kind": "DatabaseInstance",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def secret_version(kube, namespace: str) -> str:
    found = kube.kubectl("get", "secret", "shop-env", "-n", namespace, "-o", "json").stdout
    return json.loads(found)["metadata"]["resourceVersion"]


def test_app_style_and_default_secrets(kube, operator, aws, namespace):
    apply(kube, namespace, database("shop", {"name": "shop-env", "keys": APP_KEYS}))
    apply(kube, namespace, database("plain"))
    wait_ready(kube, "dbi", namespace, "shop")
    wait_ready(kube, "dbi", namespace, "plain")

    app = secret_data(kube, namespace, "shop-env")
    assert app is not None and set(app) == set(APP_KEYS)
    identifier = get(kube, "dbi", namespace, "shop")["status"]["externalName"]
    instance = aws.rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"][0]
    url = urlsplit(app["DATABASE_URL"])
    assert url.scheme == "postgresql" and url.path == "/orders"
    assert (url.hostname, url.port) == (app["PGHOST"], int(app["PGPORT"]))
    assert app["PGHOST"] == instance["Endpoint"]["Address"]
    assert (url.username, url.password) == (app["PGUSER"], app["PGPASSWORD"])
    assert app["PGUSER"] == instance["MasterUsername"] and app["PGDATABASE"] == "orders"
    assert len(app["PGPASSWORD"]) == 32

    plain = secret_data(kube, namespace, "plain-connection")
    assert plain is not None and set(plain) == DEFAULT_KEYS

    # A template change rewrites the Secret once, with the same password.
    written = len(events(kube, namespace, "shop", "SecretWritten"))
    keys = {**APP_KEYS, "DATABASE_URL": "{{ .uri }}?sslmode=require"}
    merge_patch(
        kube, "dbi", namespace, "shop", json.dumps({"spec": {"connectionSecret": {"keys": keys}}})
    )
    wait_ready(kube, "dbi", namespace, "shop", generation=2)
    changed = wait_for(
        lambda: (
            (data := secret_data(kube, namespace, "shop-env"))
            and data["DATABASE_URL"].endswith("?sslmode=require")
            and data
        ),
        what="the Secret rendered with the new template",
    )
    assert changed["PGPASSWORD"] == app["PGPASSWORD"]
    assert changed["DATABASE_URL"] == app["DATABASE_URL"] + "?sslmode=require"
    wait_for(
        lambda: len(events(kube, namespace, "shop", "SecretWritten")) == written + 1,
        what="one SecretWritten Event for the template change",
    )
    assert not events(kube, namespace, "shop", "PasswordChanged")
    # A later look at the cloud (a requested reconcile) writes nothing more.
    version = secret_version(kube, namespace)
    kube.kubectl(
        "annotate",
        "dbi",
        "shop",
        "-n",
        namespace,
        "cloud.provisioner.dev/reconcile-requested-at=now",
        "--overwrite",
    )
    wait_for(
        lambda: get(kube, "dbi", namespace, "shop")["status"].get("lastReconcileRequest") == "now",
        what="the requested reconcile",
    )
    after = secret_version(kube, namespace)
    assert after == version
    assert len(events(kube, namespace, "shop", "SecretWritten")) == written + 1


def test_templates_are_checked_at_apply_time(kube, namespace):
    unknown = try_apply(
        kube,
        namespace,
        json.dumps(
            {
                "apiVersion": "cloud.provisioner.dev/v1beta1",
                "kind": "S3Bucket",
                "metadata": {"name": "assets"},
                "spec": {"connectionSecret": {"keys": {"BUCKET_HOST": "{{ .host }}"}}},
            }
        ),
    )
    assert_refused(unknown, "a template may name only {{ .bucket }}")
    no_password = try_apply(
        kube, namespace, database("nopass", {"keys": {"PGHOST": "{{ .host }}"}})
    )
    assert_refused(no_password, "{{ .password }} or {{ .uri }}")
    bad_key = try_apply(
        kube, namespace, database("badkey", {"keys": {"DATABASE URL": "{{ .uri }}"}})
    )
    assert_refused(bad_key, "spec.connectionSecret.keys")
