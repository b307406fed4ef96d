"""Every name the API allows works end to end: up to 253 characters, through the real API
server and the session's operator (Ready, a valid and owned connection Secret, deletion)."""

from __future__ import annotations

import json
import re

import pytest

from provisioner_dev.cloud import DevCloud, inventory
from tests.helpers import (
    apply,
    events,
    get,
    manifests,
    wait_for,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.e2e

# Kubernetes' own rules (apimachinery's IsDNS1123Subdomain and IsValidLabelValue).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
OWNER_NAME = "cloud.provisioner.dev/owner-name"


def long_name(length: int, seed: str) -> str:
    """A valid name of exactly `length` characters beginning with `seed`, with dots in it;
    past 233 characters, a '-' right where a Secret name is cut."""
    chars = list((seed + "." + ("x" * 62 + ".") * 5)[:length])
    if length > 233:
        chars[231:234] = "y-y"
    chars[-1] = "z"
    name = "".join(chars)
    assert len(name) == length and DNS_SUBDOMAIN.fullmatch(name), name
    return name


def expected_secret(name: str) -> re.Pattern[str]:
    if len(name) <= 242:
        return re.compile(re.escape(name + "-connection"))
    return re.compile(re.escape(name[:233].rstrip("-.")) + r"-[0-9a-f]{8}-connection")


def expected_label(name: str) -> re.Pattern[str]:
    if len(name) <= 63:
        return re.compile(re.escape(name))
    return re.compile(re.escape(name[:54].rstrip("-.")) + r"-[0-9a-f]{8}")


def connection_secret(kube, namespace: str, cr: dict) -> dict | None:
    """The Secret owned by `cr` (found by its owner reference, not by a name we derive)."""
    found = json.loads(kube.kubectl("get", "secrets", "-n", namespace, "-o", "json").stdout)
    for secret in found["items"]:
        refs = secret["metadata"].get("ownerReferences") or []
        if any(r["uid"] == cr["metadata"]["uid"] for r in refs):
            return secret
    return None


def cloud_tags(aws, uid: str) -> list[dict[str, str]]:
    cloud = DevCloud(aws.s3.meta.endpoint_url)
    return [r.tags for r in inventory(cloud) if r.owner_uid == uid]


def check_lives(kube, aws, namespace: str, kind: str, name: str) -> dict:
    cr = wait_ready(kube, kind, namespace, name, timeout=120)
    secret = wait_for(
        lambda: connection_secret(kube, namespace, cr), timeout=60, what=f"{kind}'s Secret"
    )
    meta = secret["metadata"]
    assert expected_secret(name).fullmatch(meta["name"]), meta["name"]
    assert len(meta["name"]) <= 253 and cr["status"]["connectionSecret"] == meta["name"]
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (kind, name, True)
    for key, value in meta["labels"].items():
        assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, (key, value)
    label = meta["labels"][OWNER_NAME]
    assert expected_label(name).fullmatch(label), label
    # The label still selects it.
    selected = kube.kubectl(
        "get", "secrets", "-n", namespace, "-l", f"{OWNER_NAME}={label}", "-o", "name"
    ).stdout.split()
    assert selected == [f"secret/{meta['name']}"]
    # One cloud resource, its name tag the whole name.
    (tags,) = cloud_tags(aws, cr["metadata"]["uid"])
    assert tags["provisioner.dev/name"] == name
    # The operator's Events about it reach the object.
    assert wait_for(lambda: events(kube, namespace, name), timeout=30, what="its Events")
    return cr


LONGEST = 253


@pytest.mark.parametrize(
    ("kind", "length", "spec"),
    [
        ("S3Bucket", LONGEST, "{forceDestroy: true}"),
        ("Queue", LONGEST, "{}"),
        ("Queue", 100, "{}"),
        ("Topic", LONGEST, "{}"),
        (
            "DatabaseInstance",
            LONGEST,
            "{engine: postgres, instanceClass: db.t3.micro, deletionPolicy: Delete}",
        ),
    ],
    ids=["bucket-253", "queue-253", "queue-100", "topic-253", "database-253"],
)
def test_the_longest_names_become_ready_and_go(kube, operator, aws, namespace, kind, length, spec):
    name = long_name(length, kind.lower())
    apply(kube, namespace, manifests([(kind, name, spec)], version="v1beta1"))
    cr = check_lives(kube, aws, namespace, kind, name)
    uid = cr["metadata"]["uid"]

    kube.kubectl("delete", kind, name, "-n", namespace, "--wait=false")
    wait_gone(kube, kind, namespace, name, timeout=120)
    assert cloud_tags(aws, uid) == []
    wait_for(
        lambda: connection_secret(kube, namespace, cr) is None,
        timeout=60,
        what="its Secret deleted",
    )


def test_two_long_names_that_share_a_beginning_keep_apart(kube, operator, aws, namespace):
    """Cut names carry a hash of the whole name: two resources whose names differ only past
    the cut get Secrets and labels of their own."""
    base = long_name(250, "twin")
    first, second = base + "-aa", base + "-bb"
    apply(kube, namespace, manifests([("Queue", first, "{}"), ("Queue", second, "{}")]))
    a = check_lives(kube, aws, namespace, "Queue", first)
    b = check_lives(kube, aws, namespace, "Queue", second)
    secret_a = connection_secret(kube, namespace, a)
    secret_b = connection_secret(kube, namespace, b)
    assert secret_a and secret_b
    assert secret_a["metadata"]["name"] != secret_b["metadata"]["name"]
    assert secret_a["metadata"]["labels"][OWNER_NAME] != secret_b["metadata"]["labels"][OWNER_NAME]
    assert (
        get(kube, "queue", namespace, first)["status"]["externalName"]
        != (get(kube, "queue", namespace, second)["status"]["externalName"])
    )
