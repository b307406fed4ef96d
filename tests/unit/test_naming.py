"""provisioner.model.naming: deterministic, uid-separated, always-valid cloud names."""

from __future__ import annotations

import random
import re
import string
import uuid

import pytest

from provisioner.model import naming

# AWS rules (only the ones the brief asks for).
S3_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # 3-63 chars, alnum at both ends
SQS_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
RDS_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")

UID = "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"
OTHER_UID = "0b8e7d6c-5a4b-4c3d-8e2f-1a0b9c8d7e6f"


def assert_valid_bucket(name: str) -> None:
    assert S3_RE.match(name), name
    assert 3 <= len(name) <= 63, name


def assert_valid_queue(name: str, fifo: bool) -> None:
    assert len(name) <= 80, name
    if fifo:
        assert name.endswith(".fifo"), name
        base = name[: -len(".fifo")]
    else:
        assert not name.endswith(".fifo"), name
        base = name
    assert SQS_RE.match(base), name


def assert_valid_db(name: str) -> None:
    assert RDS_RE.match(name), name
    assert "--" not in name, name
    assert not name.endswith("-"), name


def all_names(namespace: str, name: str, uid: str) -> dict[str, str]:
    return {
        "bucket": naming.bucket_name(namespace, name, uid),
        "queue": naming.queue_name(namespace, name, uid, fifo=False),
        "fifo": naming.queue_name(namespace, name, uid, fifo=True),
        "db": naming.db_instance_identifier(namespace, name, uid),
    }


def assert_all_valid(namespace: str, name: str, uid: str) -> dict[str, str]:
    names = all_names(namespace, name, uid)
    assert_valid_bucket(names["bucket"])
    assert_valid_queue(names["queue"], fifo=False)
    assert_valid_queue(names["fifo"], fifo=True)
    assert_valid_db(names["db"])
    return names


HOSTILE = [
    ("default", "orders"),
    ("a" * 253, "b" * 253),
    ("x" * 63, "y.z" * 84),
    ("team.example.com", "db.primary.v2"),
    ("1team", "2-orders"),
    ("123", "456"),
    ("0", "0"),
    ("---", "---"),
    ("...", "..."),
    ("-.-.-", ".-.-."),
    ("", ""),
    ("UPPER", "MiXeD.Case-Name"),
    ("ns", "-leading-and-trailing-"),
    ("ns", "under_score__name"),
    ("ns", "___"),
    ("Ünïcödé", "名字"),
    ("9" * 253, "9" * 253),
    ("a" * 53, "-" * 200),
    ("sp ace", "tab\tname"),
]


@pytest.mark.parametrize(("namespace", "name"), HOSTILE)
def test_hostile_inputs_give_valid_names(namespace, name):
    assert_all_valid(namespace, name, UID)


@pytest.mark.parametrize(("namespace", "name"), HOSTILE)
def test_deterministic(namespace, name):
    assert all_names(namespace, name, UID) == all_names(namespace, name, UID)


@pytest.mark.parametrize(("namespace", "name"), HOSTILE)
def test_different_uids_give_different_names(namespace, name):
    first = all_names(namespace, name, UID)
    second = all_names(namespace, name, OTHER_UID)
    for key in first:
        assert first[key] != second[key], key


def _random_text(rng: random.Random, alphabet: str, max_len: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len)))


def test_property_random_inputs_are_valid_and_deterministic():
    rng = random.Random(20240531)
    alphabets = [
        string.ascii_lowercase + string.digits + "-.",
        string.ascii_letters + string.digits + "-._",
        "-.",
        string.digits,
        string.printable,
        "aé名-.K",
    ]
    for _ in range(1500):
        namespace = _random_text(rng, rng.choice(alphabets), 253)
        name = _random_text(rng, rng.choice(alphabets), 253)
        uid = str(uuid.UUID(int=rng.getrandbits(128)))
        names = assert_all_valid(namespace, name, uid)
        assert names == all_names(namespace, name, uid)


def test_property_many_uids_never_collide():
    rng = random.Random(7)
    for namespace, name in [("default", "orders"), ("1" * 253, "2" * 253), ("a" * 253, "b")]:
        uids = {str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(300)}
        for key in ("bucket", "queue", "fifo", "db"):
            results = {all_names(namespace, name, uid)[key] for uid in uids}
            assert len(results) == len(uids), (namespace[:10], key)


def test_readable_prefix_and_uid_hash_for_a_normal_name():
    h = naming.uid_hash(UID)
    assert len(h) == 8
    assert naming.bucket_name("default", "orders", UID) == f"default-orders-{h}"
    assert naming.queue_name("default", "orders", UID, fifo=False) == f"default-orders-{h}"
    assert naming.queue_name("default", "orders", UID, fifo=True) == f"default-orders-{h}.fifo"
    assert naming.db_instance_identifier("default", "orders", UID) == f"default-orders-{h}"


def test_names_are_lowercased_and_dots_replaced():
    assert naming.bucket_name("Team.Example", "DB.Main", UID).startswith("team-example-db-main-")
    assert naming.db_instance_identifier("Team.Example", "DB.Main", UID).startswith(
        "team-example-db-main-"
    )


def test_long_fifo_queue_name_counts_the_suffix():
    name = naming.queue_name("a" * 253, "b" * 253, UID, fifo=True)
    assert len(name) == 80
    assert name.endswith(naming.uid_hash(UID) + ".fifo")


def test_db_identifier_starting_with_a_digit_gets_a_letter():
    ident = naming.db_instance_identifier("123", "456", UID)
    assert ident[0].isalpha()
    assert "123-456" in ident


@pytest.mark.parametrize("namespace", ["default", "a" * 253, "team.example.com"])
def test_bucket_and_db_names_end_with_the_full_uid_hash(namespace):
    h = naming.uid_hash(UID)
    assert naming.bucket_name(namespace, "orders", UID).endswith("-" + h)
    assert naming.db_instance_identifier(namespace, "orders", UID).endswith("-" + h)


def test_digit_leading_long_db_identifier_keeps_the_full_uid_hash():
    ident = naming.db_instance_identifier("1" * 253, "orders", UID)
    assert_valid_db(ident)
    assert ident.endswith("-" + naming.uid_hash(UID))


def test_bucket_name_avoids_reserved_sthree_prefix():
    assert not naming.bucket_name("sthree", "data", UID).startswith("sthree-")
