"""S3 in the aws-like cloud: a deleted bucket's name refused with OperationAborted (409) for a
while."""

from __future__ import annotations

import random

from aiohttp import web

from provisioner_dev.awslike_durations import Durations
from provisioner_dev.awslike_http import Call, plain
from provisioner_dev.cloudprofile import Profile


class S3Model:
    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.deleted: dict[str, float] = {}
        self.durations = Durations(profile, rng)

    def name_held(self, bucket: str, now: float) -> bool:
        return now < self.deleted.get(bucket, 0.0)

    def bucket_deleted(self, bucket: str, now: float) -> None:
        self.deleted[bucket] = now + self.durations.draw("s3.deleted_name")


async def handle_s3(s3: S3Model, call: Call) -> web.StreamResponse:
    """An S3 REST call, answered as AWS would answer it now."""
    request = call.request
    parts = [p for p in request.path.split("/") if p]
    bucket_level = len(parts) == 1 and not request.query
    now = call.clock()
    if bucket_level and request.method == "PUT" and s3.name_held(parts[0], now):
        return call.refuse(
            "s3",
            "CreateBucket",
            "rest-xml",
            409,
            "OperationAborted",
            "A conflicting conditional operation is currently in progress against this "
            "resource. Please try again.",
        )
    answer = await call.forward()
    if bucket_level and request.method == "DELETE" and answer.status == 204:
        s3.bucket_deleted(parts[0], call.clock())
    return plain(answer)
