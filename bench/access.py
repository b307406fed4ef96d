"""AWS calls of spec.access: per grant made, per steady pass (every resync), per revocation.

The access code (provisioner/access.py) runs in process against a moto server of its own,
IRSA mode, with ServiceAccounts kept in memory; the AWS calls are counted by operation.

    .venv/bin/python bench/access.py --grants 20
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from provisioner.access import Access  # noqa: E402
from provisioner.cloud.aws import CALLS, AwsSettings  # noqa: E402
from provisioner.cloud.iam import AccessSettings  # noqa: E402
from provisioner.kinds import make_aws, parse  # noqa: E402
from provisioner.models import Resource  # noqa: E402
from provisioner_dev.stack import DEV_CREDENTIALS, DEV_REGION, MotoServer  # noqa: E402

ISSUER = "https://oidc.bench.example/id/BENCH"


class ServiceAccounts:
    """The two Kube calls IRSA grants make, and status patches, in memory."""

    def __init__(self) -> None:
        self.accounts: dict[tuple[str, str], dict[str, Any]] = {}

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.accounts.get((namespace, name))

    def annotate_service_account(self, namespace, name, key, value, resource_version) -> None:
        self.accounts[(namespace, name)]["metadata"].setdefault("annotations", {})[key] = value

    def remove_service_account_annotation(self, namespace, name, key, value) -> bool:
        return (
            self.accounts[(namespace, name)]["metadata"].get("annotations", {}).pop(key, None)
            == value
        )

    def patch_status(self, kind, namespace, name, status) -> None:
        pass


def calls(fn) -> Counter[str]:
    before = Counter(CALLS.counts)
    fn()
    after = Counter(CALLS.counts)
    counted: Counter[str] = Counter()
    for (_, operation, _), n in (after - before).items():
        counted[operation] += n
    return counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--grants", type=int, default=20, help="resources, each granting one ServiceAccount"
    )
    args = parser.parse_args()
    os.environ.update(DEV_CREDENTIALS)
    moto = MotoServer(log=Path(tempfile.mkdtemp(prefix="bench-access-")) / "moto.log")
    moto.start()
    try:
        aws = make_aws(AwsSettings(region=DEV_REGION, endpoint_url=moto.url))
        aws.client("iam").create_open_id_connect_provider(
            Url=ISSUER, ClientIDList=["sts.amazonaws.com"], ThumbprintList=["a" * 40]
        )
        aws.account_id()  # once per process, not per grant
        kube = ServiceAccounts()

        async def direct(fn, *a):
            return fn(*a)

        access = Access(AccessSettings("irsa", oidc_issuer=ISSUER), "bench", aws, kube, direct)  # type: ignore[arg-type]
        resources: list[Resource] = []
        for i in range(args.grants):
            sa = f"sa-{i}"
            kube.accounts[("bench", sa)] = {"metadata": {"name": sa, "resourceVersion": "1"}}
            body = {
                "kind": "Queue",
                "metadata": {"namespace": "bench", "name": f"q{i}", "uid": str(uuid.uuid4())},
                "spec": {"access": [{"serviceAccountName": sa, "level": "write"}]},
            }
            resources.append(parse(body, region=DEV_REGION, cluster_id="bench"))
        arn = "arn:aws:sqs:us-east-1:123456789012:q"

        def each(step) -> None:
            for i, r in enumerate(resources):
                resources[i] = step(r) or r

        def grant(r: Resource) -> Resource:
            outcome = asyncio.run(access.converge(r, arn))
            assert outcome is not None and outcome.problem is None, outcome
            return dataclasses.replace(r, status={"access": outcome.entries})

        made = calls(lambda: each(grant))
        steady = calls(lambda: each(grant))
        revoked = calls(lambda: each(lambda r: asyncio.run(access.revoke_all(r)) and None))
        n = args.grants
        print(f"{n} grants, one ServiceAccount each (IRSA), AWS calls per grant:")
        for label, counted in (("made", made), ("steady pass", steady), ("revoked", revoked)):
            detail = ", ".join(f"{op} {c / n:g}" for op, c in sorted(counted.items()))
            print(f"  {label:12} {sum(counted.values()) / n:5.2f}  ({detail})")
    finally:
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
