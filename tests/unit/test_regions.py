"""spec.region: a region the operator knows, or InvalidSpec before anything is made for it.

The CRDs refuse what is no region's name (pattern, length); the operator refuses a well-formed
name it does not know (provisioner/placement/accounts.py), before any cloud call, client or call
budget bucket; the boto3 clients it keeps are bounded besides.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import API_VERSION, config
from provisioner.aws import session as aws_module
from provisioner.aws.session import CALLS, Aws, AwsSettings
from provisioner.config import ConfigError, Settings
from provisioner.kinds import registry as kinds
from provisioner.model import conditions as cond
from provisioner.placement.accounts import AccountRefused, Directory, botocore_regions
from provisioner.reconciler.engine import Reconciler
from tests.unit.fakes import FakeKube

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=2)
ACCOUNT = {
    "metadata": {"name": "team-a", "generation": 1},
    "spec": {
        "accountId": "111111111111",
        "roleArn": "arn:aws:iam::111111111111:role/provisioner",
        "regions": ["eu-west-1", "ab-newest-1"],
        "defaultRegion": "ab-newest-1",
        "namespaceSelector": {"matchLabels": {"team": "a"}},
    },
}


def test_botocore_knows_every_partition_and_each_region_fits_the_crds_pattern():
    regions = botocore_regions()
    for region in ("us-east-1", "eu-west-1", "cn-north-1", "us-gov-west-1", "us-isob-east-1"):
        assert region in regions
    assert len(regions) > 30
    for region in regions:
        assert config.REGION_PATTERN.fullmatch(region), region
        assert len(region) <= config.REGION_MAX_LENGTH
    assert "zz-fake-9" not in regions


def region_schemas() -> list[tuple[str, dict[str, Any]]]:
    """Every region field of every CRD version: spec.region of each kind, CloudAccount's
    spec.regions items and spec.defaultRegion."""
    found = []
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == "ResourceClass":
            continue  # a class's defaults are checked against its kind's schema
        for version in crd["spec"]["versions"]:
            spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            where = f"{path.name} {version['name']}"
            if crd["spec"]["names"]["kind"] == "CloudAccount":
                found.append((f"{where} regions[]", spec["regions"]["items"]))
                found.append((f"{where} defaultRegion", spec["defaultRegion"]))
            else:
                found.append((f"{where} region", spec["region"]))
    return found


def test_every_crd_region_field_has_the_operators_pattern_and_length():
    schemas = region_schemas()
    assert len(schemas) == 4 * 2 + 2
    for where, schema in schemas:
        assert schema["pattern"] == f"^{config.REGION_PATTERN.pattern}$", where
        assert schema["maxLength"] == config.REGION_MAX_LENGTH, where


@pytest.mark.parametrize(
    ("region", "valid"),
    [
        ("us-east-1", True),
        ("eusc-de-east-1", True),  # the European Sovereign Cloud's partition
        ("us-isob-east-1", True),
        ("ap-southeast-10", True),
        ("zz-fake-9", True),  # well-formed: the operator refuses it, not the CRD
        ("x" * 100, False),
        ("mars", False),
        ("us-east", False),
        ("US-EAST-1", False),
        ("us-east-1-", False),
        ("us-east-100", False),
    ],
)
def test_the_pattern(region, valid):
    assert bool(config.REGION_PATTERN.fullmatch(region)) is valid


def test_extra_regions_from_flags_and_environment(monkeypatch):
    assert Settings().extra_regions == ()
    monkeypatch.setenv("PROVISIONER_EXTRA_REGIONS", " ab-newest-1, cd-newer-2 ,")
    assert Settings.from_env().extra_regions == ("ab-newest-1", "cd-newer-2")
    monkeypatch.setenv("PROVISIONER_EXTRA_REGIONS", "not a region")
    with pytest.raises(ConfigError, match="extra region 'not a region'"):
        Settings.from_env()
    monkeypatch.delenv("PROVISIONER_EXTRA_REGIONS")
    import argparse

    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    settings = config.from_args(parser.parse_args(["--extra-regions=ef-newer-3"]))
    assert settings.extra_regions == ("ef-newer-3",)
    with pytest.raises(ConfigError, match="x" * 40):
        config.from_args(parser.parse_args(["--extra-regions=" + "x" * 40]))


def accounts(*bodies: dict[str, Any]) -> Directory:
    by_name = {b["metadata"]["name"]: b for b in bodies}
    d = Directory(by_name.get, lambda n: {"metadata": {"name": n, "labels": {"team": "a"}}})
    for b in bodies:
        d.account_seen(b)
    return d


def refused(
    region: str,
    directory: Directory | None = None,
    settings: Settings = SETTINGS,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
) -> AccountRefused | None:
    try:
        Directory.check_region(directory, region, status or {}, settings, deleting)
    except AccountRefused as exc:
        return exc
    return None


def test_known_regions_pass_and_others_are_invalid_spec_naming_field_and_region():
    assert refused("") is None  # unset: the account's or the operator's default
    assert refused("eu-central-1") is None
    assert refused("cn-north-1") is None
    found = refused("zz-fake-9")
    assert found is not None and found.reason == cond.INVALID_SPEC
    assert "spec.region zz-fake-9" in found.message
    # The operator's own region, its extra regions and the CloudAccounts' are known too.
    assert refused("zz-fake-9", settings=Settings(region="zz-fake-9")) is None
    assert refused("zz-fake-9", settings=Settings(extra_regions=("zz-fake-9",))) is None
    assert refused("ab-newest-1", accounts(ACCOUNT)) is None
    assert refused("ab-newest-1", accounts()) is not None
    assert refused("ab-newest-1") is not None


def test_a_resource_being_deleted_may_act_where_its_status_says_it_lives():
    lives = {"region": "zz-fake-9", "externalName": "x", "account": ""}
    assert refused("zz-fake-9", status=lives, deleting=True) is None
    assert refused("zz-fake-9", status=lives) is not None  # not for anything else
    assert refused("zz-fake-8", status=lives, deleting=True) is not None


class Kube(FakeKube):
    def server_now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


def queue(region: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"namespace": "ns", "name": "q", "uid": "uid-1", "generation": 2},
        "spec": {"region": region, "deletionPolicy": "Delete"},
        "status": status,
    }


@pytest.mark.parametrize("served", [False, True], ids=["accounts-off", "accounts-on"])
def test_an_unknown_region_makes_no_call_no_client_and_no_budget_bucket(served):
    """Real cloud clients against an endpoint nothing listens on: any call would fail
    (ReconcileError), and any client or bucket made would be seen."""
    aws = Aws(AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9", attempts=1))
    kube = Kube()
    reconciler = Reconciler(
        SETTINGS,
        kube,
        kinds.make_clients(aws),
        lambda *_: None,
        directory=accounts(ACCOUNT) if served else None,
    )
    before = CALLS.total()
    try:
        result, _ = asyncio.run(reconciler.reconcile(queue("zz-fake-9"), 0, None))
        plan = queue("zz-fake-9")
        plan["metadata"]["annotations"] = {"cloud.provisioner.dev/plan-only": "true"}
        planned, _ = asyncio.run(reconciler.reconcile(plan, 0, None))
        deleted, _ = asyncio.run(reconciler.finalize(queue("zz-fake-9")))
    finally:
        reconciler.executor.shutdown(wait=True)
        reconciler.look_executor.shutdown(wait=True)
    synced = next(c for c in result.conditions if c.type == cond.SYNCED)
    assert (synced.status, synced.reason) == (False, cond.INVALID_SPEC)
    assert "spec.region zz-fake-9" in synced.message
    assert result.requeue_after is None  # a new generation is the way out
    assert planned.fields["plan"]["action"] == "Blocked"
    assert "spec.region zz-fake-9" in planned.fields["plan"]["reason"]
    # Never created anywhere, so its deletion finishes without the cloud.
    assert deleted.release_finalizer
    assert CALLS.total() == before
    assert aws._clients == {} and aws.budget.snapshot() == []
    assert kube.status_patches == []


def test_the_client_cache_keeps_the_most_recently_used(monkeypatch):
    monkeypatch.setattr(aws_module, "CLIENT_CACHE_SIZE", 3)
    aws = Aws(AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9"))
    first = aws.client("sqs", "eu-west-1")
    aws.client("sqs", "eu-west-2")
    aws.client("sqs", "eu-west-3")
    assert aws.client("sqs", "eu-west-1") is first  # used again: now the most recent
    aws.client("sqs", "us-west-2")
    assert len(aws._clients) == 3
    assert [k[1] for k in aws._clients] == ["eu-west-3", "eu-west-1", "us-west-2"]
    assert aws.client("sqs", "eu-west-1") is first
    assert re.fullmatch(r"https?://127\.0\.0\.1:9/?", first.meta.endpoint_url)
