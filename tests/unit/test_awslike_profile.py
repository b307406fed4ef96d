"""The aws-like profile file, its overrides, and `provisioner dev up`'s checks of them."""

from __future__ import annotations

import random
import re

import pytest

from provisioner.cli import main
from provisioner_dev.awslike_throttling import Throttler
from provisioner_dev.cloudprofile import PROFILE_DIR, ProfileError, load_profile


def test_the_shipped_profile_loads_with_its_documented_defaults():
    profile = load_profile()
    assert profile.time_scale == 30
    assert profile.durations["sqs.deleted_name"] == (60, 60)
    rds = profile.throttling["rds"]
    assert (rds.code, rds.status) == ("Throttling", 400)
    assert rds.bucket_for("DescribeDBInstances") == ("*DescribeDBInstances", rds.buckets["*"])
    assert (rds.buckets["*"].burst, rds.buckets["*"].rate) == (300, 12)
    sqs = profile.throttling["sqs"]
    assert (sqs.code, sqs.status) == ("RequestThrottled", 403)
    assert sqs.bucket_for("ListQueueTags")[0] == "tagging"
    assert sqs.bucket_for("GetQueueAttributes") is None
    assert profile.throttling["s3"].bucket_for("HEAD")[0] == "read"
    # An RDS instance is available after about 10 to 30 s at the default scale.
    rng = random.Random(1)
    waits = [profile.draw("rds.create", rng) + profile.draw("rds.backup", rng) for _ in range(200)]
    assert 10 <= min(waits) and max(waits) <= 30


def test_every_value_in_the_profile_file_says_where_it_comes_from():
    lines = (PROFILE_DIR / "aws-like.yaml").read_text().splitlines()
    valued = re.compile(r"^\s+(?!#)([\w.*\"]+):\s*(\[|\{|\d)")
    for number, line in enumerate(lines):
        if not valued.match(line):
            continue
        comments = []
        for previous in reversed(lines[:number]):
            if not previous.strip().startswith("#"):
                break
            comments.append(previous)
        assert comments, f"line {number + 1} has no comment: {line.strip()}"
        text = " ".join(comments).lower()
        assert "https://" in text or "same page" in text, f"no source for: {line.strip()}"


def test_overrides_replace_values_and_scale_divides_durations():
    profile = load_profile(
        time_scale="60",
        durations=["rds.create=120", "sqs.attributes=30:90"],
        throttles=["rds.*=10:1", "sqs.tagging=off", "s3.read=100:50"],
    )
    assert profile.durations["rds.create"] == (120, 120)
    assert profile.draw("rds.create", random.Random(0)) == 2
    assert profile.durations["sqs.attributes"] == (30, 90)
    assert profile.throttling["sqs"].bucket_for("TagQueue") is None
    assert profile.throttling["s3"].buckets["read"].actions == ("GET", "HEAD")
    assert profile.throttling["s3"].buckets["read"].rate == 50


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": "azure-like"}, "unknown cloud profile 'azure-like'"),
        ({"time_scale": "0"}, "time scale: '0' must be a positive number"),
        ({"time_scale": "fast"}, "time scale: 'fast' is not a number"),
        ({"time_scale": "inf"}, "must be a positive number"),
        ({"durations": ["rds.create"]}, "expected NAME=MIN[:MAX]"),
        ({"durations": ["rds.nap=1"]}, "NAME one of rds.create"),
        ({"durations": ["rds.create=9:3"]}, "minimum 9 is above maximum 3"),
        ({"durations": ["rds.create=-1"]}, "must be a >= 0 number"),
        ({"throttles": ["rds.*=300"]}, "expected BURST:RATE"),
        ({"throttles": ["rds.*=300:0"]}, "rate: '0' must be a positive number"),
        ({"throttles": ["rds.*=0.5:1"]}, "burst: 0.5 must be at least 1"),
        ({"throttles": ["ec2.*=1:1"]}, "SERVICE.BUCKET one of"),
    ],
)
def test_bad_values_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ProfileError) as raised:
        load_profile(**kwargs)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_throttler_keeps_one_bucket_per_account_region_action():
    profile = load_profile(throttles=["rds.*=2:0.001"])
    throttler = Throttler(profile)
    assert [
        throttler.allow("1", "us-east-1", "rds", "DescribeDBInstances", "") for _ in range(3)
    ] == [
        True,
        True,
        False,
    ]
    assert throttler.allow("1", "us-east-1", "rds", "DescribeDBSnapshots", "")
    assert throttler.allow("2", "us-east-1", "rds", "DescribeDBInstances", "")
    assert throttler.allow("1", "eu-west-1", "rds", "DescribeDBInstances", "")
    assert all(throttler.allow("1", "us-east-1", "sqs", "GetQueueUrl", "") for _ in range(50))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--cloud-profile", "nope"], "unknown cloud profile 'nope' (known: instant, aws-like)"),
        (["--cloud-profile", "aws-like", "--time-scale", "-3"], "time scale"),
        (["--cloud-profile", "aws-like", "--throttle", "rds.*=x:1"], "throttle rds.* burst"),
        (["--time-scale", "10"], "need --cloud-profile aws-like"),
    ],
)
def test_dev_up_refuses_bad_profiles_before_starting_anything(
    argv, words, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert main(["dev", "up", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("provisioner: ")
    assert not (tmp_path / ".dev").exists()
