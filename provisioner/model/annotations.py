"""Annotations a user or platform engineer sets on a custom resource to steer it."""

from __future__ import annotations

from provisioner import GROUP

# "true": no cloud calls at all for this resource (deletion waits too).
PAUSED = f"{GROUP}/paused"
# Any new value: reconcile now, even after a terminal error for this generation.
RECONCILE_REQUESTED_AT = f"{GROUP}/reconcile-requested-at"
# "report": drift is reported (condition Drifted, Event) but not corrected.
DRIFT_POLICY = f"{GROUP}/drift-policy"
# "true" with an explicit cloud name: take over an existing untagged resource.
ADOPT = f"{GROUP}/adopt"
# Any new value: set a new database master password, then update the Secret.
ROTATE_PASSWORD_AT = f"{GROUP}/rotate-password-at"
# Any new value: reboot the DB instance (static parameters wait for it), once per value.
REBOOT_REQUESTED_AT = f"{GROUP}/reboot-requested-at"
# "true": observe the cloud and write status.plan (what a pass would do); no cloud write.
PLAN_ONLY = f"{GROUP}/plan-only"
# Set by the API server (the chart's admission policy) at creation: who asked for it.
REQUESTED_BY = f"{GROUP}/requested-by"

# On an Event the operator posts (while tracing is on): the id of its pass's trace.
TRACE_ID = f"{GROUP}/trace-id"

# On a Namespace: the CloudAccount its resources use when they name none.
DEFAULT_ACCOUNT = f"{GROUP}/default-account"


def is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "yes", "1")
