"""Stage: plan-only. What a pass would do, in status.plan, with reads only: no cloud write,
no Secret, no status pin; the spec is not handled (observedGeneration stays). Applying
after a plan says where the cloud now differs from what the plan said."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from provisioner.aws import errors
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import Observation
from provisioner.kube.client import Kube
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model.classes import ClassRefused
from provisioner.model.resource import Resource
from provisioner.placement.accounts import AccountRefused
from provisioner.reconciler import ownership
from provisioner.reconciler.dependencies import Dependencies, needed
from provisioner.reconciler.observe import Observer
from provisioner.reconciler.outcome import Event, Result, Verdict, stamp, where
from provisioner.reconciler.placement import Placement


def shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def action(resource: Resource, obs: Observation) -> str:
    """What a pass does with what it observed: Blocked, Create, Update or None."""
    if obs.exists and not ownership.is_ours(resource, obs):
        return "Blocked"
    if not obs.exists:
        return "Create"
    return "Update" if obs.diffs else "None"


def against_plan(resource: Resource, obs: Observation) -> list[Event]:
    """Applying after a plan: what differs from what the plan said."""
    plan = resource.status.get("plan") or {}
    now_action = action(resource, obs)
    now = {d.field: shown(d.desired) for d in obs.diffs}
    then = {c.get("field"): c.get("spec") for c in plan.get("changes") or []}
    differences = []
    if plan.get("generation") != resource.generation:
        differences.append(
            f"the spec changed since (planned generation {plan.get('generation')}, "
            f"now {resource.generation})"
        )
    if plan.get("action") != now_action:
        differences.append(f"the plan said {plan.get('action')}, the cloud now needs {now_action}")
    elif now_action == "Update" and now != then:
        differences.append(f"the plan changed {sorted(then)}, now {sorted(now)}")
    return [Event("Warning", "PlanChanged", "; ".join(differences))] if differences else []


def from_class(resource: Resource) -> dict[str, Any]:
    """What of the spec comes from its ResourceClass: plan.class {name, fields}."""
    use = resource.class_use
    if use is None:
        return {}
    fields = [f"spec.{name}" for name in use.fields]
    fields += [f"spec.tags.{key}" for key in use.tag_keys]
    return {"class": {"name": use.name, "fields": fields}}


class Planner:
    def __init__(
        self, kube: Kube, placement: Placement, dependencies: Dependencies, observer: Observer
    ) -> None:
        self.kube = kube
        self.placement = placement
        self.dependencies = dependencies
        self.observer = observer

    async def plan(self, resource: Resource) -> tuple[Result, Resource]:
        """status.plan: the action, why, the field changes; Synced=False PlanOnly."""
        name = resource.external_name
        changes: list[dict[str, str]] = []
        try:
            resource = await self.placement.place(resource)
            planned, reason = await self._planned_action(resource, changes)
        except (AccountRefused, ClassRefused) as exc:
            planned, reason = "Blocked", f"{exc.reason}: {exc.message}"
        except errors.CloudError as exc:
            planned, reason = "Blocked", f"the cloud could not be observed: {exc}"
        plan = {
            "action": planned,
            "reason": reason,
            "changes": changes,
            "generation": resource.generation,
            "plannedAt": stamp(self.kube.server_now()),
            **from_class(resource),
        }
        message = (
            f"plan-only ({planned}): {reason}; remove the {annotation_keys.PLAN_ONLY} "
            "annotation to apply it"
        )
        conditions = [cond.Condition(cond.SYNCED, False, cond.PLAN_ONLY, message)]
        if not cond.find(resource.status.get("conditions"), cond.READY):
            conditions.insert(
                0, cond.Condition(cond.READY, False, cond.PLAN_ONLY, f"{name}: planned only")
            )
        result = Result(
            conditions=conditions,
            fields={"plan": plan},
            for_generation=False,
            verdict=Verdict.PLANNED,
        )
        return result, resource

    async def _planned_action(
        self, resource: Resource, changes: list[dict[str, str]]
    ) -> tuple[str, str]:
        name, kind = resource.external_name, resource.kind
        resolved: dict[str, str] = {}
        for dependency in needed(resource):
            found = await self.dependencies.ready_arn(resource.namespace, dependency)
            if found is None:
                return "Blocked", f"waiting for {dependency.role} {dependency.name} to be Ready"
            resolved[dependency.key] = found[0]
        # The dependencies' ARNs, as a pass has them: what the spec asks of them is compared.
        resource = dataclasses.replace(resource, resolved=resolved)
        obs = await self.observer.observe_plainly(resource)
        planned = action(resource, obs)
        if planned == "Blocked":
            return (
                planned,
                f"{name} exists in the cloud and is {ownership.owner(resource, obs)}: "
                "it would be left untouched",
            )
        if planned == "Create":
            place = where(resource.account.name if resource.account else "")
            made = kinds.descriptor(kind).describe_create(resource)
            return planned, f"create {kind} {name} in {place}, {resource.region}{made}"
        if planned == "None":
            return planned, f"{name} matches the spec: nothing to do"
        changes += [
            {"field": d.field, "cloud": shown(d.observed), "spec": shown(d.desired)}
            for d in obs.diffs
        ]
        reason = f"update {name}: {', '.join(d.field for d in obs.diffs)}"
        if resource.drift_report_only:
            reason += " (drift-policy report: only the fields changed in the spec are written)"
        return planned, reason
