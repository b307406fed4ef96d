"""The aws-like cloud profile: a proxy in front of moto's server that answers like AWS.

moto finishes everything inside the call, never throttles and never refuses a name. Clients
pointed here (the operator, unmodified, or boto3 in a test) see instead what AWS shows:

- RDS: `creating` then `backing-up` before `available`; `modifying` with the new values in
  PendingModifiedValues and the old ones still current until applied
  (`resetting-master-credentials` for a password alone); `storage-optimization` after a
  storage change, and no further storage change for a while; `deleting` before
  DBInstanceNotFound, the identifier refused meanwhile; snapshots `creating` before `available`;
  ModifyDBInstance refused (InvalidDBInstanceState) while the instance is busy.
- SQS: QueueDeletedRecently for a name deleted less than 60 s ago; GetQueueAttributes shows the
  old values for a while after SetQueueAttributes.
- S3: a deleted bucket's name refused with OperationAborted (409) for a while.
- Throttling: token buckets per account, region, service and action, answered with AWS's own
  code and status for each service.
- STS: AssumeRole refused (AccessDenied, 403) unless the role exists in IAM of its account and,
  when its trust policy asks for an sts:ExternalId, the call gives that one (moto lets anyone
  assume any role, existing or not).

What moto stores is never changed: the proxy only delays and reshapes what a client sees. The
durations and rates live in provisioner_dev/profiles/aws-like.yaml (each with its source);
durations are divided by the time scale, rates are not.

    python -m provisioner_dev.awslike --upstream http://127.0.0.1:5000 --port 5002 \\
        --time-scale 300 --duration rds.create=60 --throttle rds.*=20:2

Control, on the same port: GET /__profile__/stats (calls, throttles and refusals per
action; per throttling bucket the calls it let through; the durations drawn), GET
/__profile__/config (the effective profile), POST /__profile__/reset (counters).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from provisioner_dev.awslike_app import CONTROL, AwsLike, make_app
from provisioner_dev.cloudprofile import (
    ProfileError,
    add_profile_arguments,
    load_profile,
    names_help,
)
from provisioner_dev.processes import LoopbackService, free_port, wait_until

# The proxy's app is in provisioner_dev/awslike_app.py, each service's behaviour in its own
# module (awslike_rds, awslike_sqs, awslike_s3, awslike_sts), throttling in awslike_throttling.
# Here: the command line that serves it, and the launcher that runs it as a child process.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="provisioner_dev.awslike", description=__doc__, epilog=names_help()
    )
    parser.add_argument("--upstream", required=True, help="moto's server URL")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--profile", default="aws-like")
    parser.add_argument("--seed", type=int, help="seed of the duration draws")
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.profile, args.time_scale, args.duration, args.throttle)
    except ProfileError as exc:
        print(f"provisioner_dev.awslike: {exc}", file=sys.stderr)
        return 2
    state = AwsLike(upstream=args.upstream, profile=profile, seed=args.seed)
    web.run_app(
        make_app(state),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        shutdown_timeout=1.0,
    )
    return 0


def _get_json(url: str, method: str = "GET") -> dict[str, Any]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback only
        return json.loads(answer.read())


@dataclass(kw_only=True)
class AwsLikeProxy(LoopbackService):
    """provisioner_dev.awslike as a child process in front of an upstream (moto's server).

    `args` are profile arguments (see profile_args); the profile is validated here first,
    so a bad value fails in the caller with a ProfileError, not in a child's log.
    """

    upstream: str
    profile: str = "aws-like"
    args: list[str] = field(default_factory=list)
    seed: int | None = None

    def start(self, timeout: float = 30.0) -> None:
        parser = argparse.ArgumentParser()
        add_profile_arguments(parser)
        parsed = parser.parse_args(self.args)
        load_profile(self.profile, parsed.time_scale, parsed.duration, parsed.throttle)
        self.port = self.port or free_port()
        command = [
            sys.executable,
            "-m",
            "provisioner_dev.awslike",
            f"--upstream={self.upstream}",
            f"--port={self.port}",
            f"--profile={self.profile}",
            *self.args,
        ]
        if self.seed is not None:
            command.append(f"--seed={self.seed}")
        self.launch(command, self._ready, what="aws-like proxy", timeout=timeout)

    def _ready(self) -> bool:
        self.stats()
        return True

    def stats(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}stats")

    def config(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}config")

    def reset(self) -> dict[str, Any]:
        return _get_json(f"{self.url}{CONTROL}reset", method="POST")

    def wait_for(self, check: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict:
        """Poll stats until `check(stats)` holds; the stats that satisfied it."""
        seen: dict[str, Any] = {}

        def ready() -> bool:
            seen.update(self.stats())
            return check(seen)

        wait_until(ready, timeout=timeout, what="aws-like proxy stats", interval=0.05)
        return seen


if __name__ == "__main__":
    raise SystemExit(main())
