"""The dev cloud's region and credentials (moto's server takes any), and the environment a
client of it needs."""

from __future__ import annotations

DEV_REGION = "us-east-1"
DEV_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def aws_env(endpoint_url: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": DEV_REGION,
        "AWS_DEFAULT_REGION": DEV_REGION,
        **DEV_CREDENTIALS,
    }
