"""Tags of many resources in one call: the Resource Groups Tagging API's GetResources.

A periodic look at a queue, a topic or a bucket needs its tags (the owner-uid tag says
whose it is; a tag changed behind the operator's back is drift). Read one by one, that is
one call per resource and look (SQS's ListQueueTags is limited to 5 per second per
account). GetResources answers for up to 100 ARNs at once, so the resources whose resync
comes due together have their tags read with one call per 100 (`tags_by_arn`), and each
look then makes only its kind's own read (GetQueueAttributes, GetTopicAttributes, ...).

GetResources (https://docs.aws.amazon.com/resourcegroupstagging/latest/APIReference/
API_GetResources.html): ResourceARNList takes "a minimum of 1 and a maximum of 100" ARNs
and may not be combined with the pagination parameters, TagFilters or
ResourceTypeFilters; "if a resource specified by this parameter doesn't exist, it doesn't
generate an error; it simply isn't included in the response"; it "does not return untagged
resources"; regional (a region's resources only). Its rate (Tag Editor's service quotas,
https://docs.aws.amazon.com/tag-editor/latest/userguide/reference.html): "Rate of calling
the GetResources API operation: Maximum of 15 calls per second" (the call budget's
`resourcegroupstaggingapi` bucket, provisioner/aws/budget.py). IAM action:
`tag:GetResources`.

The tagging API's answer is an index the services update after the fact, so it stands in
for a resource's own tag read only when it says nothing worth acting on: the resource is
ours and tagged exactly as desired (`stands_in`). Anything else (not in the answer, another
owner, a tag differing) and the look reads the tags from the service itself, as it always
did, so drift and ownership are decided on the service's own word. `observe_tags` makes
that choice for a look, and says what the tags it goes by mean (`ObservedTags`);
`BatchTagLooks` gives a kind's client the looks of `contract.BatchTagReader` around it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provisioner.kinds.contract import FieldDiff, Observation, adoptable_by, owner_of
from provisioner.model.resource import Resource

if TYPE_CHECKING:
    from provisioner.aws.session import Aws
    from provisioner.model.account import AccountRef

SERVICE = "resourcegroupstaggingapi"
# The most ARNs one GetResources takes.
PAGE = 100

# Tags AWS puts on resources itself; users cannot set or remove them.
AWS_TAG_PREFIX = "aws:"


def tag_map(pairs: Sequence[Mapping[str, str]] | None) -> dict[str, str]:
    """Tags as the APIs list them ([{"Key": ..., "Value": ...}]), as a mapping."""
    return {pair["Key"]: pair["Value"] for pair in pairs or ()}


def tag_pairs(tags: Mapping[str, str]) -> list[dict[str, str]]:
    """A mapping of tags as the APIs take them ([{"Key": ..., "Value": ...}])."""
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def visible_tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if not k.startswith(AWS_TAG_PREFIX)}


def tag_diffs(observed: dict[str, str], desired: dict[str, str]) -> list[FieldDiff]:
    """One "tags" diff when the cloud's tags (minus AWS-managed ones) are not exactly `desired`."""
    current = visible_tags(observed)
    return [] if current == desired else [FieldDiff("tags", current, desired)]


def tag_changes(
    observed: dict[str, str], desired: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(tags to add or overwrite, keys to remove) turning `observed` into `desired`."""
    current = visible_tags(observed)
    to_set = {k: v for k, v in desired.items() if current.get(k) != v}
    return to_set, sorted(k for k in current if k not in desired)


def tags_by_arn(
    aws: Aws, region: str, arns: Sequence[str], account: AccountRef | None = None
) -> dict[str, dict[str, str]]:
    """The tags of those of `arns` the tagging API knows (absent: untagged or not there),
    with one GetResources per 100 ARNs."""
    tagging = aws.client(SERVICE, region, account)
    found: dict[str, dict[str, str]] = {}
    for start in range(0, len(arns), PAGE):
        request: dict[str, Any] = {"ResourceARNList": list(arns[start : start + PAGE])}
        while True:
            page = aws.call(tagging.get_resources, **request)
            for mapping in page.get("ResourceTagMappingList") or []:
                tags = mapping.get("Tags") or []
                found[mapping["ResourceARN"]] = {t["Key"]: t["Value"] for t in tags}
            # AWS answers a list of ARNs in one page; an emulator may page it anyway (moto:
            # about 100 tags a page), and then only the token may follow.
            token = page.get("PaginationToken")
            if not token:
                break
            request = {"PaginationToken": token}
    return found


def by_name(
    aws: Aws,
    region: str,
    arns: dict[str, str],
    account: AccountRef | None = None,
) -> dict[str, dict[str, str]]:
    """`tags_by_arn` for `arns` (ARN -> cloud name), keyed by cloud name."""
    found = tags_by_arn(aws, region, list(arns), account)
    return {arns[arn]: tags for arn, tags in found.items() if arn in arns}


def stands_in(resource: Resource, tags: dict[str, str] | None) -> bool:
    """Whether tags read in a batch may stand in for the resource's own tag read: ours, and
    exactly as desired (nothing to correct, nobody else's)."""
    return (
        tags is not None
        and owner_of(tags) == resource.uid
        and not tag_diffs(tags, resource.desired_tags)
    )


@dataclass(frozen=True)
class ObservedTags:
    """The tags a look goes by, and what they say: whose the resource is (its owner-uid
    tag), which namespace may adopt it, and the "tags" diff when they are not as desired."""

    tags: dict[str, str]
    owner_uid: str
    adoptable_by: str
    diffs: list[FieldDiff]

    @classmethod
    def of(cls, resource: Resource, tags: dict[str, str]) -> ObservedTags:
        return cls(
            tags=tags,
            owner_uid=owner_of(tags),
            adoptable_by=adoptable_by(tags),
            diffs=tag_diffs(tags, resource.desired_tags),
        )


def observe_tags(
    resource: Resource,
    batched: dict[str, str] | None,
    read: Callable[[], dict[str, str]],
) -> ObservedTags:
    """The tags of a look at `resource`: `batched` (read for many resources by `tags_by_arn`;
    None: not read so) when they may stand in for its own tag read, else what `read` (the
    service's own tag read) answers."""
    tags = batched if batched is not None and stands_in(resource, batched) else read()
    return ObservedTags.of(resource, tags)


class BatchTagLooks(ABC):
    """The looks of a kind whose tags the tagging API reads in batches (SQS, SNS, S3),
    `contract.BatchTagReader`: `observe` and `observe_tagged` are the kind's `_observe`
    without or with the tags read in a batch (which it hands to `observe_tags`), and
    `tags_many` reads a batch of tags by the ARNs `arns` names."""

    aws: Aws

    def observe(self, resource: Resource) -> Observation:
        return self._observe(resource, None)

    def observe_tagged(self, resource: Resource, tags: dict[str, str]) -> Observation:
        """A look whose tags were read in a batch: the kind's other reads only, unless the
        batch shows something to act on (then the service's own tag read decides, as in
        `observe`)."""
        return self._observe(resource, tags)

    def tags_many(
        self, region: str, names: Sequence[str], account: AccountRef | None = None
    ) -> dict[str, dict[str, str]]:
        return by_name(self.aws, region, self.arns(region, names, account), account)

    @abstractmethod
    def arns(self, region: str, names: Sequence[str], account: AccountRef | None) -> dict[str, str]:
        """ARN -> name of the resources of `names` in that region and account."""

    @abstractmethod
    def _observe(self, resource: Resource, batched: dict[str, str] | None) -> Observation:
        """Look at the resource; `batched`: its tags read in a batch (None: not read so)."""
