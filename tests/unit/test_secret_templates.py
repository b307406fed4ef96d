"""Connection Secret templates (spec.connectionSecret.keys) and the password found again."""

from __future__ import annotations

import base64
import json

import pytest

from provisioner import connection_secret as cs

PASSWORD = "Abc123xyz"
VALUES = {
    "host": "db.example",
    "port": "5432",
    "username": "app",
    "database": "orders",
    "engine": "postgres",
    "arn": "arn:aws:rds:us-east-1:123456789012:db:orders",
    "password": PASSWORD,
    "uri": cs.database_uri("postgres", "app", PASSWORD, "db.example", "5432", "orders"),
}


def secret(templates: dict[str, str], data: dict[str, str]) -> dict:
    annotations = {cs.TEMPLATE_ANNOTATION: json.dumps(templates)} if templates else {}
    return {
        "metadata": {"annotations": annotations},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def test_no_templates_keep_the_default_keys():
    assert cs.render({}, VALUES) == VALUES


def test_app_style_templates():
    templates = {
        "DATABASE_URL": "{{ .uri }}?sslmode=require",
        "PGHOST": "{{.host}}",
        "PGPORT": "{{ .port }}",
        "PGUSER": "{{ .username }}",
        "PGPASSWORD": "{{ .password }}",
        "PGDATABASE": "{{ .database }}",
    }
    assert cs.render(templates, VALUES) == {
        "DATABASE_URL": "postgresql://app:Abc123xyz@db.example:5432/orders?sslmode=require",
        "PGHOST": "db.example",
        "PGPORT": "5432",
        "PGUSER": "app",
        "PGPASSWORD": PASSWORD,
        "PGDATABASE": "orders",
    }


def test_unknown_value_names_key_and_placeholder_not_values():
    with pytest.raises(cs.TemplateError) as found:
        cs.render({"URL": "{{ .nope }}"}, VALUES)
    message = str(found.value)
    assert "spec.connectionSecret.keys.URL" in message and "{{ .nope }}" in message
    assert PASSWORD not in message


@pytest.mark.parametrize(
    "templates",
    [
        {},
        {"PGPASSWORD": "{{ .password }}"},
        {"DATABASE_URL": "{{ .uri }}"},
        {"DSN": "host={{ .host }} user={{ .username }} password={{ .password }}"},
        {"A": "{{ .host }}", "B": "jdbc:{{ .uri }}&x={{ .password }}"},
    ],
)
def test_password_is_found_again_whatever_the_template(templates):
    data = cs.render(templates, VALUES)
    assert cs.stored_password(secret(templates, data)) == PASSWORD


def test_password_found_after_the_host_changed():
    """The cloud's values may change (a new endpoint); the password stays readable."""
    templates = {"DATABASE_URL": "{{ .uri }}"}
    data = cs.render(templates, {**VALUES, "host": "old.example"})
    assert cs.stored_password(secret(templates, data)) == PASSWORD


def test_no_password_when_no_template_carries_it():
    templates = {"PGHOST": "{{ .host }}"}
    assert cs.stored_password(secret(templates, cs.render(templates, VALUES))) is None
