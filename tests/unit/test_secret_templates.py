"""Connection Secret templates (spec.connectionSecret.keys) and the password found again."""

from __future__ import annotations

import base64
import json

import pytest

from provisioner.model import connection_secret as cs

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


def secret(data: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {
        "metadata": {"annotations": annotations or {}},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def written(data: dict[str, str], password: str = PASSWORD) -> dict:
    """A Secret as the operator writes it: its data and its own annotations."""
    return secret(data, cs.own_annotations(data, password))


def fill(password: str, **changed: str) -> dict[str, str]:
    values = {**VALUES, **changed, "password": password}
    values["uri"] = cs.database_uri("postgres", "app", password, values["host"], "5432", "orders")
    return values


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


TEMPLATES = [
    {},
    {"PGPASSWORD": "{{ .password }}"},
    {"DATABASE_URL": "{{ .uri }}"},
    {"DSN": "host={{ .host }} user={{ .username }} password={{ .password }}"},
    {"A": "{{ .host }}", "B": "jdbc:{{ .uri }}&x={{ .password }}"},
]


@pytest.mark.parametrize("templates", TEMPLATES)
def test_password_is_found_again_whatever_the_template(templates):
    data = cs.render(templates, VALUES)
    assert cs.stored_password(written(data), templates, fill) == PASSWORD


@pytest.mark.parametrize("templates", TEMPLATES)
def test_password_found_without_the_annotation_from_the_specs_templates(templates):
    """A Secret written before the password's place was recorded: read against the spec."""
    data = cs.render(templates, VALUES)
    assert cs.stored_password(secret(data), templates, fill) == PASSWORD


def test_password_found_after_the_host_and_the_templates_changed():
    """The cloud's values may change (a new endpoint), the templates too: the recorded place
    still holds."""
    old = {"DATABASE_URL": "{{ .uri }}"}
    data = cs.render(old, fill(PASSWORD, host="old.example"))
    new = {"PGPASSWORD": "{{ .password }}"}
    assert cs.stored_password(written(data), new, fill) == PASSWORD


def test_no_password_when_no_template_carries_it():
    templates = {"PGHOST": "{{ .host }}"}
    data = cs.render(templates, VALUES)
    assert cs.stored_password(written(data), templates, fill) is None
    assert cs.stored_password(secret(data), templates, fill) is None


def test_nothing_in_the_secret_becomes_a_pattern():
    """A template planted in the Secret's annotations is never read: the data is matched
    against the spec's templates only (a planted template of many placeholders once made a
    backtracking pattern that froze the operator)."""
    planted = {"K": "{{ .host }}" * 12 + "{{ .password }}"}
    data = {"K": "a" * 80}
    annotations = {
        "cloud.provisioner.dev/template": json.dumps(planted),
        cs.PASSWORD_AT_ANNOTATION: "not json {",
    }
    assert cs.stored_password(secret(data, annotations), {"K": "{{ .password }}"}, fill) == (
        "a" * 80
    )
    assert cs.stored_password(secret(data, annotations), {"K": "{{ .host }}"}, fill) is None


@pytest.mark.parametrize(
    "place",
    [
        '{"key": "K", "offset": -1, "length": 32}',
        '{"key": "K", "offset": 70, "length": 32}',
        '{"key": "nope", "offset": 0, "length": 32}',
        '{"key": "K", "offset": 0, "length": 0}',
        '{"key": "K", "offset": "0", "length": 32}',
        '["K", 0, 32]',
        "x" * 5000,
    ],
)
def test_a_recorded_place_that_does_not_hold_a_password_is_ignored(place):
    data = {"K": "a" * 80 + "!"}
    assert cs.stored_password(secret(data, {cs.PASSWORD_AT_ANNOTATION: place}), {}, fill) is None


def test_an_edited_secret_is_rewritten_with_the_place_recorded():
    data = cs.render({"PGPASSWORD": "{{ .password }}"}, VALUES)
    assert cs.own_annotations(data, PASSWORD)[cs.PASSWORD_AT_ANNOTATION] == json.dumps(
        {"key": "PGPASSWORD", "offset": 0, "length": len(PASSWORD)}
    )
