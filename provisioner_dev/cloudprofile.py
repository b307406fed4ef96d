"""Cloud profiles for the dev harness: the aws-like profile file, its overrides and flags.

Kept apart from the proxy (provisioner_dev/awslike.py) so that reading and checking a profile
needs nothing but PyYAML: `provisioner dev up` checks one before it starts anything.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
INSTANT = "instant"
PROFILES = (INSTANT, "aws-like")


class ProfileError(ValueError):
    """A profile, time scale, duration or rate that cannot be used; one line saying why."""


# ---------------------------------------------------------------------------------------------
# The profile: durations and throttling buckets, from the YAML file and overrides.


@dataclass(frozen=True)
class BucketSpec:
    burst: float
    rate: float
    # The actions (S3: HTTP methods) sharing this bucket; None: each action its own ("*").
    actions: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ServiceThrottling:
    code: str
    status: int
    per: str  # "account", or "bucket" (S3: one set of buckets per S3 bucket)
    buckets: dict[str, BucketSpec | None]

    def bucket_for(self, action: str) -> tuple[str, BucketSpec] | None:
        """(bucket key, spec) an action draws from; None when it is not throttled."""
        for name, spec in self.buckets.items():
            if spec is not None and spec.actions is not None and action in spec.actions:
                return name, spec
        spec = self.buckets.get("*")
        return (f"*{action}", spec) if spec is not None else None


@dataclass(frozen=True)
class Profile:
    name: str
    time_scale: float
    # AWS seconds, (min, max), before scaling.
    durations: dict[str, tuple[float, float]]
    throttling: dict[str, ServiceThrottling]

    def draw(self, name: str, rng: random.Random) -> float:
        """One duration in real seconds: a uniform draw in AWS's range, divided by the scale."""
        low, high = self.durations[name]
        return rng.uniform(low, high) / self.time_scale

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "time_scale": self.time_scale,
            "durations_aws_seconds": {k: list(v) for k, v in self.durations.items()},
            "durations_seconds": {
                k: [round(v / self.time_scale, 3) for v in pair]
                for k, pair in self.durations.items()
            },
            "throttling": {
                service: {
                    "code": t.code,
                    "status": t.status,
                    "per": t.per,
                    "buckets": {
                        name: None
                        if spec is None
                        else {"burst": spec.burst, "rate": spec.rate, "actions": spec.actions}
                        for name, spec in t.buckets.items()
                    },
                }
                for service, t in self.throttling.items()
            },
        }


def _number(text: str, what: str, *, positive: bool = False) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ProfileError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ProfileError(
            f"{what}: {text!r} must be a {'positive' if positive else '>= 0'} number"
        )
    return value


def _duration(value: Any, what: str) -> tuple[float, float]:
    if isinstance(value, list | tuple) and len(value) == 2:
        low, high = (_number(str(v), what) for v in value)
    else:
        low = high = _number(str(value), what)
    if low > high:
        raise ProfileError(f"{what}: minimum {low:g} is above maximum {high:g}")
    return low, high


def _bucket(value: Any, what: str) -> BucketSpec | None:
    if value is None or value == "off":
        return None
    if not isinstance(value, dict):
        raise ProfileError(f"{what}: expected burst and rate")
    burst = _number(str(value.get("burst")), f"{what} burst", positive=True)
    rate = _number(str(value.get("rate")), f"{what} rate", positive=True)
    if burst < 1:
        raise ProfileError(f"{what} burst: {burst:g} must be at least 1")
    actions = value.get("actions")
    return BucketSpec(burst, rate, tuple(actions) if actions else None)


def profile_names() -> tuple[str, ...]:
    return PROFILES


def load_profile(
    name: str = "aws-like",
    time_scale: str | float | None = None,
    durations: list[str] | None = None,
    throttles: list[str] | None = None,
) -> Profile:
    """The named profile with overrides applied; ProfileError (one line) for anything wrong."""
    if name not in PROFILES or name == INSTANT:
        known = ", ".join(p for p in PROFILES if p != INSTANT)
        raise ProfileError(f"unknown cloud profile {name!r} for the proxy (known: {known})")
    path = PROFILE_DIR / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"cannot read cloud profile {path}: {exc}") from None
    scale = _number(
        str(time_scale if time_scale is not None else data.get("time_scale", 1)),
        "time scale",
        positive=True,
    )
    table = _durations(data, durations or [])
    throttling = _throttling(data, throttles or [])
    return Profile(name=name, time_scale=scale, durations=table, throttling=throttling)


def _durations(data: dict[str, Any], overrides: list[str]) -> dict[str, tuple[float, float]]:
    """The profile file's durations, with `NAME=MIN[:MAX]` overrides applied."""
    table = {k: _duration(v, f"duration {k}") for k, v in (data.get("durations") or {}).items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in table:
            raise ProfileError(
                f"duration {item!r}: expected NAME=MIN[:MAX] with NAME one of {', '.join(table)}"
            )
        table[key] = _duration(value.split(":") if ":" in value else value, f"duration {key}")
    return table


def _throttling(data: dict[str, Any], overrides: list[str]) -> dict[str, ServiceThrottling]:
    """The profile file's throttling, with `SERVICE.BUCKET=BURST:RATE|off` overrides applied."""
    services: dict[str, dict[str, Any]] = {}
    for service, spec in (data.get("throttling") or {}).items():
        error = spec.get("error") or {}
        services[service] = {
            "code": str(error.get("code", "Throttling")),
            "status": int(error.get("status", 400)),
            "per": str(spec.get("per", "account")),
            "buckets": {
                b: _bucket(v, f"throttle {service}.{b}")
                for b, v in (spec.get("buckets") or {}).items()
            },
        }
    for item in overrides:
        key, sep, value = item.partition("=")
        service, _, bucket = key.partition(".")
        known = services.get(service, {}).get("buckets", {})
        if not sep or service not in services or not (bucket in known or bucket == "*"):
            names = [f"{s}.{b}" for s, v in services.items() for b in v["buckets"]]
            raise ProfileError(
                f"throttle {item!r}: expected SERVICE.BUCKET=BURST:RATE or =off with "
                f"SERVICE.BUCKET one of {', '.join(names)} (or SERVICE.*)"
            )
        if value == "off":
            known[bucket] = None
            continue
        burst, sep, rate = value.partition(":")
        if not sep:
            raise ProfileError(f"throttle {item!r}: expected BURST:RATE, e.g. {key}=300:12")
        old = known.get(bucket)
        known[bucket] = _bucket(
            {"burst": burst, "rate": rate, "actions": old.actions if old else None},
            f"throttle {key}",
        )
    return {s: ServiceThrottling(**v) for s, v in services.items()}


def names_help() -> str:
    try:
        profile = load_profile()
    except ProfileError as exc:
        return str(exc)
    durations = ", ".join(
        f"{k}={lo:g}" + (f":{hi:g}" if hi != lo else "")
        for k, (lo, hi) in profile.durations.items()
    )
    buckets = ", ".join(
        f"{s}.{b}=" + ("off" if spec is None else f"{spec.burst:g}:{spec.rate:g}")
        for s, t in profile.throttling.items()
        for b, spec in t.buckets.items()
    )
    return f"durations (AWS seconds): {durations}. throttles (burst:rate per second): {buckets}."


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--time-scale",
        help="divide every duration of the profile by this (default: the profile's, 30)",
    )
    parser.add_argument(
        "--duration",
        action="append",
        default=[],
        metavar="NAME=MIN[:MAX]",
        help="override a duration, in AWS seconds before scaling (repeatable)",
    )
    parser.add_argument(
        "--throttle",
        action="append",
        default=[],
        metavar="SERVICE.BUCKET=BURST:RATE|off",
        help="override a throttling bucket (repeatable)",
    )


@dataclass(frozen=True)
class CloudProfile:
    """What `provisioner dev up --cloud-profile` asked for: a profile name and its overrides."""

    name: str
    args: list[str] = field(default_factory=list)


def profile_args(
    time_scale: str | float | None = None,
    durations: list[str] | None = None,
    throttles: list[str] | None = None,
) -> list[str]:
    """The proxy's command-line arguments for these overrides."""
    args = [] if time_scale is None else [f"--time-scale={time_scale}"]
    args += [f"--duration={d}" for d in durations or []]
    args += [f"--throttle={t}" for t in throttles or []]
    return args


def requested_profile(
    name: str,
    time_scale: str | float | None = None,
    durations: list[str] | None = None,
    throttles: list[str] | None = None,
) -> CloudProfile | None:
    """What a command line asked for: None for the instant cloud (moto as it is), else the
    profile and its overrides, checked; ProfileError (one line) for anything wrong."""
    if name not in PROFILES:
        raise ProfileError(f"unknown cloud profile {name!r} (known: {', '.join(PROFILES)})")
    if name == INSTANT:
        if time_scale is not None or durations or throttles:
            raise ProfileError(
                "--time-scale, --duration and --throttle need --cloud-profile aws-like"
            )
        return None
    load_profile(name, time_scale, durations, throttles)
    return CloudProfile(name, profile_args(time_scale, durations, throttles))
