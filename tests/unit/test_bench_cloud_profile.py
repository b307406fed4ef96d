"""bench/converge.py and bench/soak.py refuse a bad cloud profile in one line, before
starting anything (their runs are tested end to end in tests/e2e)."""

from __future__ import annotations

import pytest

from bench import soak
from bench.converge import parse_args

BAD = [
    (["--cloud-profile", "nope"], "unknown cloud profile 'nope' (known: instant, aws-like)"),
    (["--cloud-profile", "aws-like", "--time-scale", "0"], "time scale: '0' must be a positive"),
    (["--cloud-profile", "aws-like", "--time-scale", "fast"], "time scale: 'fast' is not a number"),
    (
        ["--time-scale", "10"],
        "--time-scale, --duration and --throttle need --cloud-profile aws-like",
    ),
    (["--cloud-profile", "aws-like", "--throttle", "rds.*=x:1"], "throttle rds.* burst"),
]


@pytest.mark.parametrize(("argv", "words"), BAD)
def test_converge_refuses_a_bad_profile_in_one_line(argv, words):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    message = str(exc.value.code)
    assert message.startswith("bench/converge.py: ") and words in message
    assert "\n" not in message


@pytest.mark.parametrize(("argv", "words"), BAD)
def test_soak_refuses_a_bad_profile_in_one_line(argv, words, monkeypatch):
    monkeypatch.setattr(soak, "Soak", lambda *a: pytest.fail("started despite a bad profile"))
    with pytest.raises(SystemExit) as exc:
        soak.main(argv)
    message = str(exc.value.code)
    assert message.startswith("bench/soak.py: ") and words in message
    assert "\n" not in message


def test_converge_takes_the_aws_like_profile_and_its_overrides():
    opts = parse_args(["--cloud-profile", "aws-like", "--time-scale", "300", "--n", "4"])
    assert (opts.cloud_profile, opts.time_scale, opts.duration, opts.throttle) == (
        "aws-like",
        "300",
        [],
        [],
    )
    assert parse_args([]).cloud_profile == "instant"
