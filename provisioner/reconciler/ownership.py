"""Whose a cloud resource is: ours by its owner-uid tag, by our own interrupted create
(`status.createToken`), or adopted with its cloud owner's consent (the adoptable-by tag);
anything else is a NameConflict that never shows another owner's uid."""

from __future__ import annotations

from provisioner.kinds.contract import ADOPTABLE_BY_TAG, Observation
from provisioner.model import conditions as cond
from provisioner.model import naming
from provisioner.model.resource import Resource
from provisioner.reconciler.outcome import Result, Verdict


def owner(resource: Resource, obs: Observation) -> str:
    """Whose the cloud resource is, as a message may say it: never another owner's uid."""
    if obs.owner_uid:
        return "owned by another resource"
    if resource.adopt and resource.explicit_name:
        return (
            "not created by this operator, and its owner has not allowed this namespace to "
            f"adopt it (the tag {ADOPTABLE_BY_TAG}={resource.namespace} on it does that)"
        )
    return "not created by this operator"


def create_token(resource: Resource) -> str:
    """What `status.createToken` holds once a create of this resource's cloud name began:
    written right before a create call that cannot tag (S3), and nowhere else."""
    return naming.uid_hash(f"{resource.uid}/{resource.external_name}", 16)


def is_ours(resource: Resource, obs: Observation) -> bool:
    if obs.owned_by(resource):
        return True
    if obs.owner_uid:
        return False  # another owner's, whatever the annotations say
    # No owner tag at all, but our own status recorded a create of this name before the
    # call: an earlier create of ours was interrupted before its tags were written.
    # (status.externalName is no proof: failure paths write it too.)
    if resource.status.get("createToken") == create_token(resource):
        return True
    return adopting(resource, obs)


def adopting(resource: Resource, obs: Observation) -> bool:
    """Asked to take over an untagged resource named explicitly in the spec, which its
    owner allowed this namespace to adopt (the `adoptable-by` tag)."""
    return bool(
        obs.exists
        and not obs.owner_uid
        and resource.adopt
        and resource.explicit_name
        and obs.adoptable_by == resource.namespace
    )


def name_conflict(resource: Resource, obs: Observation) -> Result:
    message = (
        f"{resource.external_name} already exists in the cloud and is {owner(resource, obs)}; "
        "it is left untouched: choose another name"
    )
    return Result(
        conditions=[
            cond.Condition(cond.READY, False, cond.UNAVAILABLE, "the cloud name is taken"),
            cond.Condition(cond.SYNCED, False, cond.NAME_CONFLICT, message),
        ],
        verdict=Verdict.NAME_CONFLICT,
    )
