"""Cloud clients, one per kind, and the few helpers they share."""

from __future__ import annotations

from provisioner.cloud.base import FieldDiff

# Tags AWS puts on resources itself; users cannot set or remove them.
AWS_TAG_PREFIX = "aws:"


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
