"""AWS calls of spec.access: per grant made, per steady pass (every resync), per revocation.

The access code (provisioner/access/grants.py) runs in process against a moto server of its own,
IRSA mode, with ServiceAccounts kept in memory; the AWS calls are counted by operation.

    .venv/bin/python bench/access.py --grants 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from provisioner.access.grants import Access  # noqa: E402
from provisioner.access.iam import AccessSettings  # noqa: E402
from provisioner.aws.session import CALLS, AwsSettings  # noqa: E402
from provisioner.kinds.registry import make_aws, parse  # noqa: E402
from provisioner.model.resource import Resource  # noqa: E402
from provisioner_dev.awsenv import DEV_CREDENTIALS, DEV_REGION  # noqa: E402
from provisioner_dev.serviceaccounts import MemoryServiceAccounts  # noqa: E402
from provisioner_dev.services import MotoServer  # noqa: E402

ISSUER = "https://oidc.bench.example/id/BENCH"


class ServiceAccounts(MemoryServiceAccounts):
    """The Kube calls of IRSA grants, in memory; status patches are not kept."""

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
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
        # The platform team's own call: the operator's client leaves it out of its model.
        boto3.client(
            "iam", region_name=DEV_REGION, endpoint_url=moto.url
        ).create_open_id_connect_provider(
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
            kube.add_service_account("bench", sa)
            body = {
                "kind": "Queue",
                "metadata": {"namespace": "bench", "name": f"q{i}", "uid": str(uuid.uuid4())},
                "spec": {"access": [{"serviceAccountName": sa, "level": "write"}]},
            }
            resources.append(parse(body, region=DEV_REGION, cluster_id="bench"))
        arn = "arn:aws:sqs:us-east-1:123456789012:q"

        def grant_all() -> None:  # status.access is kept on each resource as it goes
            for resource in resources:
                outcome = asyncio.run(access.converge(resource, [arn]))
                assert outcome is not None and outcome.problem is None, outcome

        def revoke_all() -> None:
            for resource in resources:
                asyncio.run(access.revoke_all(resource))

        made = calls(grant_all)
        steady = calls(grant_all)
        revoked = calls(revoke_all)
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
