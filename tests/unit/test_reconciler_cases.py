"""The reconciler, case by case, in process: a real Reconciler over a fake cloud and a fake
Kubernetes API (tests/unit/fakes.py), one case per branch of the create, update, drift,
Secret, password, failure and delete paths.

Each case says in one sentence why it matters, sets up the cloud, the Secret and the custom
resource's body, drives one entry point (`reconcile`, `resync`, `finalize`) one or more
times, reporting each pass the way the operator does (Events, then the status patch merged
into the stored body), and checks what a user would see: conditions, cloud calls, Events,
Secret writes, requeue and the finalizer. A few invariants hold for every case: no password
in any condition, Event or status, a foreign Secret never touched, and a database's Secret
holding the password the cloud last accepted once the resource is Ready and Synced.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from provisioner import API_VERSION, FINALIZER
from provisioner.aws import errors
from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.kinds.contract import ADOPTABLE_BY_TAG
from provisioner.kube.client import KubeError
from provisioner.model import annotations as annotation_keys
from provisioner.model import conditions as cond
from provisioner.model import connection_secret
from provisioner.model.resource import Resource
from provisioner.reconciler.engine import Reconciler
from provisioner.reconciler.outcome import Event, Result
from provisioner.reconciler.ownership import create_token
from tests.unit.fakes import CloudObject, FakeCloud, FakeKube, FakePasswordCloud, Journal

NS, NAME, UID = "team-a", "orders", "6f1c2a4e-0d2b-4c1e-9a7f-3b5d8e9f0a1b"
SECRET = f"{NAME}-connection"
DLQ = "orders-dlq"
DLQ_ARN = "arn:aws:sqs:us-east-1:000000000000:team-a-orders-dlq"
SEEDED_PASSWORD = "Seeded0Password0Value0000000000A"
SETTINGS = Settings(region="us-east-1", cluster_id="test", workers=4)

# Specs as the API server stores them: the CRD defaults filled in.
DEFAULT_SPECS: dict[str, dict[str, Any]] = {
    "Queue": {
        "fifo": False,
        "visibilityTimeoutSeconds": 30,
        "messageRetentionSeconds": 345600,
        "delaySeconds": 0,
        "deletionPolicy": "Delete",
    },
    "S3Bucket": {
        "versioning": False,
        "encryption": "AES256",
        "blockPublicAccess": True,
        "forceDestroy": False,
        "deletionPolicy": "Delete",
    },
    "DatabaseInstance": {
        "engine": "postgres",
        "instanceClass": "db.t3.micro",
        "allocatedStorageGiB": 20,
        "masterUsername": "app",
        "multiAZ": False,
        "publiclyAccessible": False,
        "backupRetentionDays": 7,
        "deletionPolicy": "Snapshot",
    },
}

PAUSE = {annotation_keys.PAUSED: "true"}
REPORT = {annotation_keys.DRIFT_POLICY: "report"}
REQUEST = {annotation_keys.RECONCILE_REQUESTED_AT: "2030-01-02T03:04:05Z"}
ROTATE = {annotation_keys.ROTATE_PASSWORD_AT: "rotation-1"}
ADOPT = {annotation_keys.ADOPT: "true"}

# last_handled: a new resource (kopf's `old` is None) or the spec itself (a pass for an
# annotation edit, a reconcile request or a resume: nothing in the spec changed).
NEW = "new"
SAME = "same"
# Stands for the resource's cloud name in expected status fields.
EXTERNAL_NAME = "<external name>"
CREATE_TOKEN = "<create token>"

READY = (True, cond.AVAILABLE)
SYNCED = (True, cond.RECONCILE_SUCCESS)
RETRYING = (False, cond.RECONCILE_ERROR)
VIS = "spec.visibilityTimeoutSeconds"
DELAY = "spec.delaySeconds"


def n(reason: str) -> tuple[str, str]:
    return ("Normal", reason)


def w(reason: str) -> tuple[str, str]:
    return ("Warning", reason)


def condition(type_: str, status: bool, reason: str, message: str = "", gen: int = 1) -> dict:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": gen,
        "lastTransitionTime": "2030-01-01T00:00:00Z",
    }


@dataclass
class Expect:
    # Final conditions by type: (status, reason), or None for "absent". Unlisted: not checked.
    conditions: dict[str, tuple[bool, str] | None] = field(default_factory=dict)
    # The cloud calls that change something (create, update, delete, set_password), in order.
    writes: list[str] = field(default_factory=list)
    # Not even an observation.
    cloud_untouched: bool = False
    # Every Event of every pass, (type, reason), in order.
    events: list[tuple[str, str]] = field(default_factory=list)
    # create | replace | delete of the connection Secret, in order.
    secret_writes: list[str] = field(default_factory=list)
    requeue: bool = False
    release: bool = False
    # The last pass was skipped (resync of an unsettled or paused resource).
    skipped: bool = False
    # Fields of the final status (EXTERNAL_NAME stands for the cloud name).
    status: dict[str, Any] = field(default_factory=dict)
    # The fields of the diffs handed to each update() call.
    update_fields: list[list[str]] | None = None
    # A substring of the final message of a condition type.
    message_has: dict[str, str] = field(default_factory=dict)
    check: Callable[[World], None] | None = None


@dataclass
class Case:
    why: str
    expect: Expect
    kind: str = "Queue"
    entry: str = "reconcile"  # reconcile | resync | finalize
    spec: dict[str, Any] = field(default_factory=dict)  # over DEFAULT_SPECS[kind]
    generation: int = 1
    annotations: dict[str, str] = field(default_factory=dict)
    # NEW, SAME, or the spec last handled as overrides of DEFAULT_SPECS[kind].
    last_handled: str | dict[str, Any] = NEW
    # "settled": the status of a resource that reconciled at `settled_at` (default: generation).
    status: str | None = None
    settled_at: int | None = None
    status_conditions: list[dict[str, Any]] = field(default_factory=list)
    status_fields: dict[str, Any] = field(default_factory=dict)
    # FakeCloud.seed arguments for an object of the resource's name; None: nothing there.
    cloud: dict[str, Any] | None = None
    # The connection Secret: None, "ours", "edited", "no-password" or "foreign".
    secret: str | None = None
    # The dead-letter Queue's status when the spec names one; None: no such Queue.
    dead_letter: dict[str, Any] | None = None
    script: Callable[[World], None] | None = None  # before the first pass
    between: Callable[[World], None] | None = None  # between passes
    passes: int = 1
    # Different entry points pass after pass (overrides entry and passes).
    sequence: tuple[str, ...] = ()
    # The resource's namespace is being deleted.
    namespace_terminating: bool = False

    @property
    def entries(self) -> tuple[str, ...]:
        return self.sequence or (self.entry,) * self.passes


@dataclass
class World:
    case: Case
    journal: Journal
    kube: FakeKube
    clouds: dict[str, FakeCloud]
    resource: Resource
    events: list[Event] = field(default_factory=list)
    results: list[Result | None] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    last_handled: dict[str, Any] | None = None
    seeded_secret: dict[str, Any] | None = None

    @property
    def cloud(self) -> FakeCloud:
        return self.clouds[self.case.kind]

    @property
    def name(self) -> str:
        return self.resource.external_name

    @property
    def obj(self) -> CloudObject | None:
        return self.cloud.objects.get(self.name)

    def body(self) -> dict[str, Any]:
        return copy.deepcopy(self.kube.resources[(self.case.kind, NS, NAME)])

    @property
    def status(self) -> dict[str, Any]:
        return self.kube.resources[(self.case.kind, NS, NAME)].get("status") or {}

    def secret(self) -> dict[str, Any] | None:
        return self.kube.secrets.get((NS, SECRET))

    def secret_data(self) -> dict[str, str]:
        found = self.secret()
        return connection_secret.decode(found) if found else {}


# -- building the world ------------------------------------------------------------------


def spec_of(case: Case) -> dict[str, Any]:
    return {**copy.deepcopy(DEFAULT_SPECS[case.kind]), **copy.deepcopy(case.spec)}


def settled_status(resource: Resource, cloud: FakeCloud, gen: int) -> dict[str, Any]:
    name = resource.external_name
    ready = f"{name} is available; connection Secret {resource.secret_name} is written"
    return {
        "observedGeneration": gen,
        "externalName": name,
        "arn": cloud.arn(name),
        "connectionSecret": resource.secret_name,
        "conditions": [
            condition(cond.READY, True, cond.AVAILABLE, ready, gen),
            condition(cond.SYNCED, True, cond.RECONCILE_SUCCESS, "", gen),
        ],
    }


def seed_secret(world: World, how: str) -> dict[str, Any]:
    resource, cloud = world.resource, world.cloud
    obj = world.obj or CloudObject({}, {}, cloud.arn(world.name), password=SEEDED_PASSWORD)
    data = cloud.connection(world.name, obj)
    if isinstance(cloud, FakePasswordCloud) and how != "no-password":
        data = cloud.with_password(data, obj.password)
    body: dict[str, Any]
    if how == "foreign":
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NS, "labels": {"app": "someone-else"}},
            "data": {"token": base64.b64encode(b"not-ours").decode()},
        }
    else:
        written = obj.password if isinstance(cloud, FakePasswordCloud) else None
        body = connection_secret.build(resource, data, written if how != "no-password" else None)
        if how == "edited":
            body["data"]["host"] = base64.b64encode(b"edited.example").decode()
    return copy.deepcopy(world.kube.put_secret(NS, body))


def build_world(case: Case) -> World:
    journal: Journal = []
    kube = FakeKube(journal)
    clouds: dict[str, FakeCloud] = {
        "Queue": FakeCloud("Queue", journal=journal),
        "S3Bucket": FakeCloud("S3Bucket", tags_on_create=False, journal=journal),
        "DatabaseInstance": FakePasswordCloud("DatabaseInstance", journal=journal),
    }
    spec = spec_of(case)
    meta: dict[str, Any] = {
        "namespace": NS,
        "name": NAME,
        "uid": UID,
        "generation": case.generation,
        "annotations": dict(case.annotations),
    }
    if case.entry == "finalize":
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
        meta["finalizers"] = [FINALIZER]
    body = {"apiVersion": API_VERSION, "kind": case.kind, "metadata": meta, "spec": spec}
    resource = kinds.parse(body, region=SETTINGS.region, cluster_id=SETTINGS.cluster_id)
    world = World(case, journal, kube, clouds, resource)

    status: dict[str, Any] = {}
    if case.status == "settled":
        status = settled_status(resource, world.cloud, case.settled_at or case.generation)
    for extra in case.status_conditions:
        kept = [c for c in status.get("conditions", []) if c["type"] != extra["type"]]
        status["conditions"] = [*kept, extra]
    for key, value in case.status_fields.items():
        status[key] = {
            EXTERNAL_NAME: resource.external_name,
            CREATE_TOKEN: create_token(resource),
        }.get(value, value)
    body["status"] = status
    kube.resources[(case.kind, NS, NAME)] = body

    if case.namespace_terminating:
        kube.namespaces[NS] = {
            "metadata": {"name": NS, "deletionTimestamp": "2030-01-01T00:00:00Z"},
            "status": {"phase": "Terminating"},
        }
    if case.cloud is not None:
        seed = dict(case.cloud)
        if case.kind == "DatabaseInstance":
            seed.setdefault("password", SEEDED_PASSWORD)
        world.cloud.seed(resource, **seed)
    if case.secret is not None:
        world.seeded_secret = seed_secret(world, case.secret)
    if "deadLetter" in spec and case.dead_letter is not None:
        kube.resources[("Queue", NS, DLQ)] = {
            "apiVersion": API_VERSION,
            "kind": "Queue",
            "metadata": {"namespace": NS, "name": DLQ, "uid": "dlq-uid", "generation": 1},
            "spec": copy.deepcopy(DEFAULT_SPECS["Queue"]),
            "status": case.dead_letter,
        }
    if case.last_handled == SAME:
        world.last_handled = copy.deepcopy(spec)
    elif isinstance(case.last_handled, dict):
        world.last_handled = {**copy.deepcopy(DEFAULT_SPECS[case.kind]), **case.last_handled}
    if case.script:
        case.script(world)
    return world


def run(case: Case) -> World:
    """Drive the case's entry point `passes` times, reporting each pass like the operator."""
    world = build_world(case)
    reconciler = Reconciler(
        SETTINGS,
        world.kube,  # type: ignore[arg-type]
        world.clouds,  # type: ignore[arg-type]
        lambda body, event: world.events.append(event),
    )

    async def drive() -> None:
        for retry, entry in enumerate(case.entries):
            if retry and case.between:
                case.between(world)
            body = world.body()
            outcome: tuple[Result, Resource] | None
            if entry == "reconcile":
                outcome = await reconciler.reconcile(body, retry, world.last_handled)
            elif entry == "resync":
                outcome = await reconciler.resync(body)
            else:
                outcome = await reconciler.finalize(body, retry)
            if outcome is None:
                world.results.append(None)
                continue
            result, resource = outcome
            reconciler.emit(body, resource, result)
            patch = reconciler.status_patch(resource, result)
            world.results.append(result)
            world.patches.append(patch)
            world.kube.merge_status(case.kind, NS, NAME, patch)
            if entry == "reconcile" and result.requeue_after is None:
                # kopf keeps the spec of a handler that finished as the last handled one.
                world.last_handled = copy.deepcopy(body["spec"])

    try:
        asyncio.run(drive())
    finally:
        reconciler.executor.shutdown(wait=True)
    return world


# -- scripts -------------------------------------------------------------------------------


def fail(method: str, exc: Exception, nth: int | None = 1) -> Callable[[World], None]:
    return lambda world: world.cloud.script.fail(method, exc, nth)


def kube_fail(method: str, exc: Exception, nth: int | None = 1) -> Callable[[World], None]:
    return lambda world: world.kube.script.fail(method, exc, nth)


def cloud_knob(**knobs: Any) -> Callable[[World], None]:
    def apply(world: World) -> None:
        for key, value in knobs.items():
            assert hasattr(world.cloud, key), key
            setattr(world.cloud, key, value)

    return apply


def become_available(world: World) -> None:
    assert world.obj is not None
    world.obj.state = "available"


def password_in_error(resource: Resource, password: str) -> Exception:
    return RuntimeError(f"the endpoint rejected MasterUserPassword={password}")


# -- checks beyond the table's columns -------------------------------------------------------


def name_recorded_before_create(world: World) -> None:
    patch = ("kube", "patch_status", NAME)
    create = ("cloud", "create", world.name)
    assert patch in world.journal and create in world.journal
    assert world.journal.index(patch) < world.journal.index(create)
    token = create_token(world.resource)
    assert world.kube.status_patches == [
        ("S3Bucket", NAME, {"externalName": world.name, "createToken": token})
    ]


def no_uid_shown(world: World, uid: str) -> None:
    """Another owner's uid appears nowhere a tenant reads."""
    shown = json.dumps(
        [world.kube.status_patches, world.patches, world.status, world.events], default=str
    )
    assert uid not in shown


def no_status_write_before_create(world: World) -> None:
    assert world.kube.status_patches == []


def one_cloud_object(world: World) -> None:
    assert list(world.cloud.objects) == [world.name]


def redrive_resolved(world: World) -> None:
    create = next(c for c in world.cloud.calls if c.method == "create")
    assert create.fields["spec.deadLetter"] == {
        "deadLetterTargetArn": DLQ_ARN,
        "maxReceiveCount": 5,
    }


def drift_left_in_cloud(world: World) -> None:
    assert world.obj is not None and world.obj.fields[VIS] == 99


def wrote_nothing(world: World) -> None:
    assert world.patches == [{}]
    assert world.kube.status_patches == []


def password_handed_to_create(world: World) -> None:
    create = next(c for c in world.cloud.calls if c.method == "create")
    assert create.secrets == ("password",)
    assert world.obj is not None and world.obj.password
    assert world.secret_data()["password"] == world.obj.password


def password_unchanged(world: World) -> None:
    assert world.obj is not None and world.obj.password == SEEDED_PASSWORD
    assert world.secret_data().get("password") == SEEDED_PASSWORD


def cloud_then_secret(world: World) -> None:
    assert world.obj is not None and world.obj.password != SEEDED_PASSWORD
    assert world.secret_data()["password"] == world.obj.password
    set_at = world.journal.index(("cloud", "set_password", world.name))
    written = [
        i
        for i, (who, method, _) in enumerate(world.journal)
        if who == "kube" and method in ("create_secret", "replace_secret")
    ]
    assert written and all(set_at < i for i in written)


def passes_then_release(world: World) -> None:
    first, last = world.results[0], world.results[-1]
    assert first is not None and not first.release_finalizer and first.requeue_after
    assert last is not None and last.release_finalizer
    # The Secret goes only with the cloud resource, in the last pass.
    assert [who_method for who_method in world.kube.secret_writes] == [("delete", SECRET)]
    assert world.obj is None


def cloud_object_kept(world: World) -> None:
    assert world.obj is not None


def secret_kept(world: World) -> None:
    assert world.secret() is not None


def skipped_second_pass(world: World) -> None:
    assert world.results[-1] is not None and world.results[-1].conditions == []
    assert [c.method for c in world.cloud.calls].count("observe") == 1


def only_calls(world: World, methods: list[str]) -> None:
    assert [c.method for c in world.cloud.calls] == methods, world.cloud.calls


# -- the table -------------------------------------------------------------------------------

SETTLED_QUEUE: dict[str, Any] = {"status": "settled", "cloud": {}, "secret": "ours"}
SETTLED_DB: dict[str, Any] = {
    "kind": "DatabaseInstance",
    "status": "settled",
    "cloud": {},
    "secret": "ours",
}
DRIFTED_VIS = {"fields": {VIS: 99}}
# The cloud as an older spec left it: visibilityTimeoutSeconds 30 (the new spec says 60).
OLD_VIS = {"fields": {VIS: 30}}
DEAD_LETTER = {"deadLetter": {"queueRef": {"name": DLQ}, "maxReceiveCount": 5}}
DRIFT_REPORTED = condition(cond.DRIFTED, True, cond.DRIFT_REPORTED, f"{VIS}: 99 -> 30")
INVALID_SPEC = condition(cond.SYNCED, False, cond.INVALID_SPEC, "the cloud refused the spec")
NAME_CONFLICT = condition(cond.SYNCED, False, cond.NAME_CONFLICT, "taken")
HANDLER_RETRYING = condition(cond.SYNCED, False, cond.RECONCILE_ERROR, "cloud call failed")


def case(id_: str, why: str, expect: Expect, **kwargs: Any) -> Any:
    return pytest.param(Case(why=why, expect=expect, **kwargs), id=id_)


CASES = [
    # -- create ---------------------------------------------------------------------------
    case(
        "create-new",
        "A new resource gets exactly one create call, its Secret and Ready with two Events.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED, cond.DRIFTED: None},
            writes=["create"],
            events=[n("Created"), n("Available")],
            secret_writes=["create"],
            status={
                "externalName": EXTERNAL_NAME,
                "connectionSecret": SECRET,
                "observedGeneration": 1,
            },
            check=no_status_write_before_create,
        ),
    ),
    case(
        "create-answer-trusted",
        "A create that says what it made is not read back: one observe, one create, Ready.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available")],
            secret_writes=["create"],
            check=lambda world: only_calls(world, ["observe", "create"]),
        ),
        script=cloud_knob(answers_create=True),
    ),
    case(
        "create-answer-creating",
        "A create that answers `creating` waits with backoff, without reading it back first.",
        Expect(
            conditions={cond.READY: (False, cond.CREATING)},
            writes=["create"],
            events=[n("Created"), n("Creating")],
            requeue=True,
            check=lambda world: only_calls(world, ["observe", "create"]),
        ),
        kind="DatabaseInstance",
        script=cloud_knob(answers_create=True, create_state="creating"),
    ),
    case(
        "create-lost-answer",
        "A create whose answer was lost, retried on a stale read, ends with one owned resource.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create", "create"],
            events=[w("ReconcileError"), n("Created"), n("Available"), n("ReconcileSuccess")],
            secret_writes=["create"],
            check=one_cloud_object,
        ),
        script=cloud_knob(lose_create_answer=True),
        between=cloud_knob(stale_observes=1),
        passes=2,
    ),
    case(
        "create-name-taken",
        "A cloud name owned by another resource is never written to and is reported once.",
        Expect(
            conditions={
                cond.READY: (False, cond.UNAVAILABLE),
                cond.SYNCED: (False, "NameConflict"),
            },
            events=[w("Unavailable"), w("NameConflict")],
            message_has={cond.SYNCED: "owned by another resource"},
            check=lambda world: no_uid_shown(world, "someone-else"),
        ),
        cloud={"owner": "other"},
    ),
    case(
        "create-conflict-not-ours",
        "A create refused as 'already exists' by someone else's resource is a NameConflict.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            writes=["create"],
            events=[w("Unavailable"), w("NameConflict")],
            check=lambda world: assert_owner(world, "someone-else"),
        ),
        cloud={"owner": "other"},
        script=cloud_knob(stale_observes=1),
    ),
    case(
        "s3-records-name-first",
        "A kind that tags after creating records its cloud name before the create call.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available")],
            secret_writes=["create"],
            status={"externalName": EXTERNAL_NAME},
            check=name_recorded_before_create,
        ),
        kind="S3Bucket",
    ),
    case(
        "s3-untagged-own-bucket",
        "An untagged bucket whose create our status recorded is our interrupted create: tag it.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["update"],
            update_fields=[["tags"]],
            events=[n("Updated"), n("Available")],
            secret_writes=["create"],
        ),
        kind="S3Bucket",
        cloud={"owner": "none"},
        status_fields={"externalName": EXTERNAL_NAME, "createToken": CREATE_TOKEN},
    ),
    case(
        "s3-name-in-status-is-no-proof",
        "status.externalName alone (failure paths write it too) never makes a bucket ours.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            events=[w("Unavailable"), w("NameConflict")],
            message_has={cond.SYNCED: "not created by this operator"},
        ),
        kind="S3Bucket",
        cloud={"owner": "none"},
        status_fields={"externalName": EXTERNAL_NAME},
    ),
    case(
        "s3-untagged-unknown-bucket",
        "An untagged bucket our status never recorded is someone else's: NameConflict.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            events=[w("Unavailable"), w("NameConflict")],
            message_has={cond.SYNCED: "not created by this operator"},
        ),
        kind="S3Bucket",
        cloud={"owner": "none"},
    ),
    case(
        "adopt-untagged",
        "Adoption makes the spec win on every field, even under report, and is no drift.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED, cond.DRIFTED: None},
            writes=["update"],
            update_fields=[[VIS, "tags"]],
            events=[n("Adopted"), n("Updated"), n("Available")],
            secret_writes=["create"],
        ),
        spec={"queueName": "legacy-orders"},
        annotations={**ADOPT, **REPORT},
        last_handled=SAME,
        cloud={"owner": "none", **DRIFTED_VIS, "tags": {ADOPTABLE_BY_TAG: NS}},
    ),
    case(
        "adopt-needs-the-owners-consent",
        "The adopt annotation alone never takes over an untagged resource: its owner must "
        "have tagged it adoptable by this namespace.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            events=[w("Unavailable"), w("NameConflict")],
            message_has={cond.SYNCED: f"{ADOPTABLE_BY_TAG}={NS}"},
        ),
        spec={"queueName": "legacy-orders"},
        annotations=ADOPT,
        cloud={"owner": "none"},
    ),
    case(
        "adopt-consent-for-another-namespace",
        "A resource its owner allowed another namespace to adopt is refused here.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            events=[w("Unavailable"), w("NameConflict")],
        ),
        spec={"queueName": "legacy-orders"},
        annotations=ADOPT,
        cloud={"owner": "none", "tags": {ADOPTABLE_BY_TAG: "team-b"}},
    ),
    case(
        "adopt-refuses-other-owner",
        "The adopt annotation never takes over a resource tagged with another owner.",
        Expect(
            conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)},
            events=[w("Unavailable"), w("NameConflict")],
        ),
        spec={"queueName": "legacy-orders"},
        annotations=ADOPT,
        cloud={"owner": "other"},
    ),
    case(
        "dependency-missing",
        "A Queue whose dead-letter Queue does not exist waits without a single cloud call.",
        Expect(
            conditions={cond.READY: (False, cond.WAITING_FOR_DEPENDENCY), cond.SYNCED: SYNCED},
            cloud_untouched=True,
            events=[n("WaitingForDependency")],
            requeue=True,
            message_has={cond.READY: f"dead-letter Queue {DLQ}"},
        ),
        spec=DEAD_LETTER,
    ),
    case(
        "dependency-not-ready",
        "A dead-letter Queue that is not Ready yet holds the create back until it is.",
        Expect(
            conditions={cond.READY: (False, cond.WAITING_FOR_DEPENDENCY)},
            cloud_untouched=True,
            events=[n("WaitingForDependency")],
            requeue=True,
        ),
        spec=DEAD_LETTER,
        dead_letter={"conditions": [condition(cond.READY, False, cond.CREATING)]},
    ),
    case(
        "dependency-ready",
        "A Ready dead-letter Queue's ARN reaches the create call as the redrive target.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available")],
            secret_writes=["create"],
            check=redrive_resolved,
        ),
        spec=DEAD_LETTER,
        dead_letter={"arn": DLQ_ARN, "conditions": [condition(cond.READY, True, cond.AVAILABLE)]},
    ),
    case(
        "creating-requeues",
        "A resource the cloud is still creating requeues without writing a Secret yet.",
        Expect(
            conditions={cond.READY: (False, cond.CREATING), cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Creating")],
            requeue=True,
        ),
        kind="DatabaseInstance",
        script=cloud_knob(create_state="creating"),
    ),
    case(
        "creating-then-available",
        "The password handed to create reaches the Secret once the database is available.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Creating"), n("Available")],
            secret_writes=["create"],
            check=password_handed_to_create,
        ),
        kind="DatabaseInstance",
        script=cloud_knob(create_state="creating"),
        between=become_available,
        passes=2,
    ),
    case(
        "unavailable",
        "A resource that stops serving turns Ready=False with a Warning and is re-checked.",
        Expect(
            conditions={cond.READY: (False, cond.UNAVAILABLE), cond.SYNCED: SYNCED},
            events=[w("Unavailable")],
            requeue=True,
        ),
        **{**SETTLED_DB, "cloud": {"state": "storage-full"}},
        last_handled=SAME,
    ),
    # -- requested changes and drift --------------------------------------------------------
    case(
        "requested-change",
        "A spec change is written to exactly the field that changed and announced as Updated.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED, cond.DRIFTED: None},
            writes=["update"],
            update_fields=[[VIS]],
            events=[n("Updated")],
            status={"observedGeneration": 2},
        ),
        **{**SETTLED_QUEUE, "cloud": OLD_VIS},
        generation=2,
        settled_at=1,
        spec={"visibilityTimeoutSeconds": 60},
        last_handled={},
    ),
    case(
        "requested-tag-change",
        "A change of spec.tags is a requested change of the cloud's tags, not drift.",
        Expect(
            conditions={cond.SYNCED: SYNCED, cond.DRIFTED: None},
            writes=["update"],
            update_fields=[["tags"]],
            events=[n("Updated")],
        ),
        **{**SETTLED_QUEUE, "cloud": {"tags": {"team": "a"}}},
        generation=2,
        settled_at=1,
        spec={"tags": {"team": "b"}},
        last_handled={"tags": {"team": "a"}},
    ),
    case(
        "drift-corrected-on-resync",
        "Drift found by the periodic resync is put back by default and reported as corrected.",
        Expect(
            conditions={cond.READY: READY, cond.DRIFTED: (False, cond.DRIFT_CORRECTED)},
            writes=["update"],
            update_fields=[[VIS]],
            events=[w("Drifted")],
            message_has={cond.DRIFTED: f"{VIS}: 99 -> 30"},
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        entry="resync",
    ),
    case(
        "drift-corrected-same-generation",
        "An annotation edit (spec unchanged) also corrects drift: every pass is a check.",
        Expect(
            conditions={cond.SYNCED: SYNCED, cond.DRIFTED: (False, cond.DRIFT_CORRECTED)},
            writes=["update"],
            update_fields=[[VIS]],
            events=[w("Drifted")],
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations={"team.example/owner": "payments"},
        last_handled=SAME,
    ),
    case(
        "drift-corrected-on-request",
        "A reconcile request corrects drift and records the request it acted on.",
        Expect(
            conditions={cond.DRIFTED: (False, cond.DRIFT_CORRECTED)},
            writes=["update"],
            events=[w("Drifted")],
            status={"lastReconcileRequest": REQUEST[annotation_keys.RECONCILE_REQUESTED_AT]},
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations=REQUEST,
        last_handled=SAME,
    ),
    case(
        "drift-reported-on-resync",
        "Under drift-policy report a resync reports drift with one Warning and writes nothing.",
        Expect(
            conditions={
                cond.READY: READY,
                cond.SYNCED: SYNCED,
                cond.DRIFTED: (True, cond.DRIFT_REPORTED),
            },
            events=[w("Drifted")],
            message_has={cond.DRIFTED: f"{VIS}: 99 -> 30"},
            check=drift_left_in_cloud,
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations=REPORT,
        entry="resync",
    ),
    case(
        "drift-reported-on-request",
        "Under report a reconcile request reports drift instead of correcting it.",
        Expect(
            conditions={cond.SYNCED: SYNCED, cond.DRIFTED: (True, cond.DRIFT_REPORTED)},
            events=[w("Drifted")],
            status={"lastReconcileRequest": REQUEST[annotation_keys.RECONCILE_REQUESTED_AT]},
            check=drift_left_in_cloud,
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations={**REPORT, **REQUEST},
        last_handled=SAME,
    ),
    case(
        "drift-reported-same-generation",
        "Under report an annotation edit (spec unchanged) reports drift and writes nothing.",
        Expect(
            conditions={cond.SYNCED: SYNCED, cond.DRIFTED: (True, cond.DRIFT_REPORTED)},
            events=[w("Drifted")],
            check=drift_left_in_cloud,
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations=REPORT,
        last_handled=SAME,
    ),
    case(
        "drift-reported-once",
        "Drift that stays the same is not reported again at every resync.",
        Expect(
            conditions={cond.DRIFTED: (True, cond.DRIFT_REPORTED)},
            events=[w("Drifted")],
            check=drift_left_in_cloud,
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        annotations=REPORT,
        entry="resync",
        passes=2,
    ),
    case(
        "report-applies-requested-change",
        "Under report a spec change is still written, alone, and the other drift stays reported.",
        Expect(
            conditions={cond.SYNCED: SYNCED, cond.DRIFTED: (True, cond.DRIFT_REPORTED)},
            writes=["update"],
            update_fields=[[DELAY]],
            events=[w("Drifted"), n("Updated")],
            check=drift_left_in_cloud,
        ),
        **{**SETTLED_QUEUE, "cloud": {"fields": {VIS: 99, DELAY: 0}}},
        annotations=REPORT,
        generation=2,
        settled_at=1,
        spec={"delaySeconds": 5},
        last_handled={},
    ),
    case(
        "drift-cleared",
        "Drifted goes back to False (NoDrift) once the cloud matches the spec again.",
        Expect(conditions={cond.READY: READY, cond.DRIFTED: (False, cond.NO_DRIFT)}),
        **SETTLED_QUEUE,
        status_conditions=[DRIFT_REPORTED],
        annotations=REPORT,
        entry="resync",
    ),
    case(
        "report-lifted-corrects",
        "Removing drift-policy report lets the next pass correct the drift it reported.",
        Expect(
            conditions={cond.DRIFTED: (False, cond.DRIFT_CORRECTED)},
            writes=["update"],
            update_fields=[[VIS]],
            events=[w("Drifted")],
        ),
        **{**SETTLED_QUEUE, "cloud": DRIFTED_VIS},
        status_conditions=[DRIFT_REPORTED],
        last_handled=SAME,
    ),
    case(
        "written-settling",
        "SQS reads may show an attribute's old value for up to 60 s after a write: the pass "
        "stays Synced, says so, and looks again instead of writing twice or crying drift.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["update"],
            events=[n("Updated")],
            requeue=True,
            message_has={cond.SYNCED: "may show the previous value"},
        ),
        **{**SETTLED_QUEUE, "cloud": OLD_VIS},
        generation=2,
        settled_at=1,
        spec={"visibilityTimeoutSeconds": 60},
        last_handled={},
        script=cloud_knob(hold_updates=True),
    ),
    case(
        "vanished-recreated",
        "A resource deleted behind the operator's back is recreated at the next resync.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[w("Vanished"), n("Created")],
        ),
        **{**SETTLED_QUEUE, "cloud": None},
        entry="resync",
    ),
    case(
        "nothing-to-do",
        "A resync that finds everything in place writes nothing: no call, patch or Event.",
        Expect(conditions={cond.READY: READY, cond.SYNCED: SYNCED}, check=wrote_nothing),
        **SETTLED_QUEUE,
        entry="resync",
    ),
    # -- connection Secrets ------------------------------------------------------------------
    case(
        "secret-restored",
        "A connection Secret deleted by someone is written again at the next resync.",
        Expect(
            conditions={cond.READY: READY},
            events=[n("SecretWritten")],
            secret_writes=["create"],
        ),
        **{**SETTLED_QUEUE, "secret": None},
        entry="resync",
    ),
    case(
        "secret-edited",
        "A connection Secret whose values were edited is put back.",
        Expect(events=[n("SecretWritten")], secret_writes=["replace"]),
        **{**SETTLED_QUEUE, "secret": "edited"},
        entry="resync",
    ),
    case(
        "secret-foreign",
        "A Secret of that name owned by something else is never overwritten: Synced=False.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            writes=["create"],
            events=[n("Created"), w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: f"Secret {SECRET} exists and is not owned by this Queue"},
        ),
        secret="foreign",
    ),
    # -- the database password ------------------------------------------------------------------
    case(
        "db-password-on-create",
        "A new database gets a generated password in its create call and in its Secret.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available")],
            secret_writes=["create"],
            check=password_handed_to_create,
        ),
        kind="DatabaseInstance",
    ),
    case(
        "db-password-kept",
        "The password in the Secret is kept: a resync neither changes nor rewrites it.",
        Expect(conditions={cond.READY: READY}, check=password_unchanged),
        **SETTLED_DB,
        entry="resync",
    ),
    case(
        "db-rotation",
        "A rotation request sets the new password in the cloud first, then in the Secret.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["set_password"],
            events=[n("PasswordChanged"), n("SecretWritten")],
            secret_writes=["replace"],
            status={"lastPasswordRotation": ROTATE[annotation_keys.ROTATE_PASSWORD_AT]},
            check=cloud_then_secret,
        ),
        **SETTLED_DB,
        annotations=ROTATE,
        last_handled=SAME,
    ),
    case(
        "db-rotation-done",
        "A rotation request already acted on does not change the password again.",
        Expect(conditions={cond.SYNCED: SYNCED}, check=password_unchanged),
        **SETTLED_DB,
        annotations=ROTATE,
        status_fields={"lastPasswordRotation": ROTATE[annotation_keys.ROTATE_PASSWORD_AT]},
        last_handled=SAME,
    ),
    case(
        "db-lost-secret",
        "A database whose Secret was deleted gets a new password, cloud first, then Secret.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["set_password"],
            events=[n("PasswordChanged"), n("SecretWritten")],
            secret_writes=["create"],
            check=cloud_then_secret,
        ),
        **{**SETTLED_DB, "secret": None},
        entry="resync",
    ),
    case(
        "db-secret-without-password",
        "A Secret that lost its password key gets a new password, cloud first.",
        Expect(
            writes=["set_password"],
            events=[n("PasswordChanged"), n("SecretWritten")],
            secret_writes=["replace"],
            check=cloud_then_secret,
        ),
        **{**SETTLED_DB, "secret": "no-password"},
        entry="resync",
    ),
    case(
        "db-foreign-secret",
        "A foreign Secret must not cost the database its password on every retry.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "is not owned by this DatabaseInstance"},
            check=lambda world: assert_password(world, SEEDED_PASSWORD),
        ),
        **{**SETTLED_DB, "secret": "foreign"},
        last_handled=SAME,
    ),
    case(
        "db-rotation-foreign-secret",
        "A rotation is not done in the cloud while its Secret cannot be written.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            check=lambda world: assert_password(world, SEEDED_PASSWORD),
        ),
        **{**SETTLED_DB, "secret": "foreign"},
        annotations=ROTATE,
        last_handled=SAME,
    ),
    case(
        "db-rotation-secret-write-fails",
        "A rotation whose Secret write failed is redone, so the Secret ends with the cloud's.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["set_password", "set_password"],
            events=[
                n("PasswordChanged"),
                w("ReconcileError"),
                n("PasswordChanged"),
                n("SecretWritten"),
                n("ReconcileSuccess"),
            ],
            secret_writes=["replace"],
            status={"lastPasswordRotation": ROTATE[annotation_keys.ROTATE_PASSWORD_AT]},
            check=cloud_then_secret,
        ),
        **SETTLED_DB,
        annotations=ROTATE,
        last_handled=SAME,
        script=kube_fail("replace_secret", KubeError(500, "InternalError", "etcd timeout")),
        passes=2,
    ),
    case(
        "db-password-not-in-errors",
        "An error that quotes the password reaches no condition or Event with it.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            writes=["set_password"],
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "unexpected error, will retry: RuntimeError"},
        ),
        **{**SETTLED_DB, "secret": None},
        last_handled=SAME,
        script=fail("set_password", password_in_error),  # type: ignore[arg-type]
    ),
    # -- paused and terminal ------------------------------------------------------------------
    case(
        "paused",
        "A paused resource gets no cloud call and no Secret access at all.",
        Expect(
            conditions={cond.SYNCED: (False, cond.PAUSED)},
            cloud_untouched=True,
            events=[w("Paused")],
            check=lambda world: assert_no_kube_calls(world),
        ),
        annotations=PAUSE,
    ),
    case(
        "paused-resync",
        "The periodic resync leaves a paused resource alone too.",
        Expect(skipped=True, cloud_untouched=True),
        **SETTLED_QUEUE,
        annotations=PAUSE,
        entry="resync",
    ),
    case(
        "terminal-invalid-spec",
        "A spec the cloud refuses is InvalidSpec with the cloud's words and no requeue.",
        Expect(
            conditions={
                cond.READY: (False, cond.UNAVAILABLE),
                cond.SYNCED: (False, cond.INVALID_SPEC),
            },
            writes=["create"],
            events=[w("Unavailable"), w("InvalidSpec")],
            status={"externalName": EXTERNAL_NAME, "observedGeneration": 1},
            message_has={cond.SYNCED: "InvalidParameterValue: delay too long"},
        ),
        script=fail("create", errors.TerminalError("delay too long", "InvalidParameterValue")),
    ),
    case(
        "terminal-skipped-same-generation",
        "After InvalidSpec the same generation is not tried again: no cloud call.",
        Expect(
            conditions={cond.SYNCED: (False, cond.INVALID_SPEC)},
            writes=["create"],
            events=[w("Unavailable"), w("InvalidSpec")],
            check=skipped_second_pass,
        ),
        script=fail("create", errors.TerminalError("delay too long", "InvalidParameterValue")),
        passes=2,
    ),
    case(
        "terminal-retried-on-request",
        "A reconcile request retries a generation that failed with InvalidSpec.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available"), n("ReconcileSuccess")],
            secret_writes=["create"],
            status={"lastReconcileRequest": REQUEST[annotation_keys.RECONCILE_REQUESTED_AT]},
        ),
        status_conditions=[
            condition(cond.READY, False, cond.UNAVAILABLE, "refused"),
            INVALID_SPEC,
        ],
        annotations=REQUEST,
        last_handled=SAME,
    ),
    case(
        "terminal-retried-on-new-generation",
        "A new generation after InvalidSpec is tried again.",
        Expect(
            conditions={cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Created"), n("Available"), n("ReconcileSuccess")],
            secret_writes=["create"],
            status={"observedGeneration": 2},
        ),
        generation=2,
        status_conditions=[INVALID_SPEC],
        last_handled={"delaySeconds": 1000},
    ),
    case(
        "terminal-resync-skipped",
        "The resync does not hammer the cloud with a spec it refused.",
        Expect(skipped=True, cloud_untouched=True),
        status_conditions=[INVALID_SPEC],
        status_fields={"observedGeneration": 1},
        entry="resync",
    ),
    case(
        "name-conflict-skipped",
        "A NameConflict is not retried for the same generation without a request.",
        Expect(cloud_untouched=True, conditions={cond.SYNCED: (False, cond.NAME_CONFLICT)}),
        cloud={"owner": "other"},
        status_conditions=[NAME_CONFLICT],
        last_handled=SAME,
    ),
    # -- failures --------------------------------------------------------------------------
    case(
        "retryable-error",
        "Throttling becomes ReconcileError with the cloud's words and a requeue.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "cloud call failed, will retry: Throttling: Rate exceeded"},
        ),
        script=fail("observe", errors.RetryableError("Rate exceeded", "Throttling")),
    ),
    case(
        "credentials-error",
        "Missing credentials are a platform problem: ReconcileError saying so, requeued.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "no AWS credentials found"},
        ),
        script=fail("observe", errors.CredentialsError("no AWS credentials found")),
    ),
    case(
        "kube-error",
        "A failing Kubernetes API call is retried and named as such.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "Kubernetes API call failed, will retry: 503"},
        ),
        **SETTLED_QUEUE,
        last_handled=SAME,
        script=kube_fail("get_secret", KubeError(503, "ServiceUnavailable", "try again")),
    ),
    case(
        "unexpected-exception",
        "A bug in a client becomes a retried ReconcileError naming only the exception type.",
        Expect(
            conditions={cond.SYNCED: RETRYING},
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "unexpected error, will retry: KeyError"},
        ),
        script=fail("observe", KeyError("DBInstances")),
    ),
    case(
        "update-fails",
        "A failed update keeps Synced=False and is retried; the spec is not given up on.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: RETRYING},
            writes=["update"],
            events=[w("ReconcileError")],
            requeue=True,
        ),
        **{**SETTLED_QUEUE, "cloud": OLD_VIS},
        generation=2,
        settled_at=1,
        spec={"visibilityTimeoutSeconds": 60},
        last_handled={},
        script=fail("update", errors.RetryableError("Service unavailable", "ServiceUnavailable")),
    ),
    case(
        "create-name-held",
        "A name AWS still holds after a deletion (QueueDeletedRecently) is waited out: "
        "Ready=False saying until about when, Synced stays True, no error Event storm.",
        Expect(
            conditions={cond.READY: (False, cond.CREATING), cond.SYNCED: SYNCED},
            writes=["create"],
            events=[n("Creating")],
            requeue=True,
            message_has={cond.READY: "still holds the name"},
        ),
        script=fail(
            "create",
            errors.NameHeldError("the queue was deleted recently", "QueueDeletedRecently"),
        ),
    ),
    case(
        "update-retry-later",
        "A change the cloud refuses for a documented time (one RDS storage change per 6 h) "
        "waits that long, saying so, instead of retrying every few seconds.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: RETRYING},
            writes=["update"],
            events=[w("ReconcileError")],
            requeue=True,
            message_has={cond.SYNCED: "trying again in 600 s"},
        ),
        **{**SETTLED_QUEUE, "cloud": OLD_VIS},
        generation=2,
        settled_at=1,
        spec={"visibilityTimeoutSeconds": 60},
        last_handled={},
        script=fail(
            "update",
            errors.RetryLaterError("storage is being optimized", "InvalidParameterCombination"),
        ),
    ),
    case(
        "resync-failure",
        "A resync that fails shows it as Synced=False but never requeues itself.",
        Expect(conditions={cond.SYNCED: RETRYING}, events=[w("ReconcileError")]),
        **SETTLED_QUEUE,
        entry="resync",
        script=fail("observe", errors.RetryableError("Rate exceeded", "Throttling")),
    ),
    case(
        "resync-after-failed-resync",
        "A resync that failed is tried again at the next resync: nothing else would.",
        Expect(
            conditions={cond.READY: READY, cond.SYNCED: SYNCED},
            writes=["create", "create"],
            events=[
                w("Vanished"),
                w("ReconcileError"),
                w("Vanished"),
                n("Created"),
                n("ReconcileSuccess"),
            ],
        ),
        **{**SETTLED_QUEUE, "cloud": None},
        entry="resync",
        script=fail("create", errors.RetryableError("Rate exceeded", "Throttling")),
        passes=2,
    ),
    case(
        "failed-resync-handed-to-handler",
        "Once a change handler retries a resource, the resync leaves it alone again.",
        Expect(
            skipped=True,
            writes=["create", "create"],
            events=[w("Vanished"), w("ReconcileError")],
        ),
        **{**SETTLED_QUEUE, "cloud": None},
        last_handled=SAME,
        sequence=("resync", "reconcile", "resync"),
        script=fail("create", errors.RetryableError("Rate exceeded", "Throttling"), nth=None),
    ),
    case(
        "resync-waits-for-handler",
        "The resync leaves a generation whose change handler is still retrying to it.",
        Expect(skipped=True, cloud_untouched=True),
        **SETTLED_QUEUE,
        status_conditions=[HANDLER_RETRYING],
        entry="resync",
    ),
    case(
        "resync-waits-for-new-generation",
        "The resync leaves a spec change the change handler has not handled yet to it.",
        Expect(skipped=True, cloud_untouched=True),
        **SETTLED_QUEUE,
        generation=2,
        settled_at=1,
        entry="resync",
    ),
    case(
        "resync-waits-while-creating",
        "A resource the change handler waits on (creating) is polled by its backoff alone.",
        Expect(
            skipped=True,
            writes=["create"],
            events=[n("Created"), n("Creating")],
            check=lambda world: only_calls(world, ["observe", "create", "observe"]),
        ),
        kind="DatabaseInstance",
        script=cloud_knob(create_state="creating"),
        sequence=("reconcile", "resync"),
    ),
    case(
        "resync-again-once-handler-done",
        "Once the change handler has finished waiting, the resync checks the resource again.",
        Expect(
            writes=["create"],
            events=[n("Created"), n("Creating"), n("Available")],
            secret_writes=["create"],
            check=lambda world: only_calls(
                world, ["observe", "create", "observe", "observe", "observe"]
            ),
        ),
        kind="DatabaseInstance",
        script=cloud_knob(create_state="creating"),
        between=become_available,
        sequence=("reconcile", "resync", "reconcile", "resync"),
    ),
    # -- deletion ----------------------------------------------------------------------------
    case(
        "delete-retain",
        "deletionPolicy Retain keeps the cloud resource, removes the Secret and releases.",
        Expect(
            cloud_untouched=True,
            events=[n("Retained")],
            secret_writes=["delete"],
            release=True,
            check=cloud_object_kept,
        ),
        **SETTLED_QUEUE,
        spec={"deletionPolicy": "Retain"},
        entry="finalize",
    ),
    case(
        "delete-waits-until-gone",
        "The finalizer stays until the cloud says NotFound; only then the Secret goes.",
        Expect(
            conditions={cond.READY: (False, cond.DELETING)},
            writes=["delete"],
            events=[n("Deleting"), n("Deleted")],
            secret_writes=["delete"],
            release=True,
            check=passes_then_release,
        ),
        **SETTLED_DB,
        entry="finalize",
        script=cloud_knob(deletion_lingers=1),
        passes=2,
    ),
    case(
        "delete-immediate",
        "A resource that is gone right after its delete call is released in one pass.",
        Expect(
            writes=["delete"],
            events=[n("Deleted")],
            secret_writes=["delete"],
            release=True,
        ),
        **SETTLED_QUEUE,
        entry="finalize",
    ),
    case(
        "delete-already-gone",
        "A resource already gone from the cloud is released without a delete call.",
        Expect(events=[n("Deleted")], secret_writes=["delete"], release=True),
        **{**SETTLED_QUEUE, "cloud": None},
        entry="finalize",
    ),
    case(
        "delete-already-deleting",
        "A resource the cloud is already deleting is waited for, not deleted twice.",
        Expect(
            conditions={cond.READY: (False, cond.DELETING)},
            events=[n("Deleting")],
            requeue=True,
            check=secret_kept,
        ),
        **{**SETTLED_DB, "cloud": {"state": "deleting"}},
        entry="finalize",
        script=lambda world: setattr(world.obj, "lingers", 5),
    ),
    case(
        "delete-not-ours",
        "Deleting a CR whose cloud name belongs to someone else never deletes their resource.",
        Expect(
            events=[w("LeftUntouched")],
            secret_writes=["delete"],
            release=True,
            check=cloud_object_kept,
        ),
        **{**SETTLED_QUEUE, "cloud": {"owner": "other"}},
        entry="finalize",
    ),
    case(
        "delete-untagged-own-bucket",
        "An untagged bucket left by our interrupted create is still deleted with its CR.",
        Expect(writes=["delete"], events=[n("Deleted")], release=True),
        kind="S3Bucket",
        cloud={"owner": "none"},
        status_fields={"externalName": EXTERNAL_NAME, "createToken": CREATE_TOKEN},
        entry="finalize",
    ),
    case(
        "delete-blocked",
        "A bucket that still holds objects keeps its finalizer and says what to do.",
        Expect(
            conditions={cond.READY: (False, cond.DELETING)},
            writes=["delete"],
            events=[n("Deleting")],
            requeue=True,
            message_has={cond.READY: "set spec.forceDestroy"},
            check=secret_kept,
        ),
        **{**SETTLED_QUEUE, "kind": "S3Bucket"},
        entry="finalize",
        script=cloud_knob(block_deletion="bucket still holds objects; set spec.forceDestroy"),
    ),
    case(
        "delete-fails",
        "A failed delete call is retried; the finalizer and the Secret stay.",
        Expect(
            conditions={cond.READY: (False, cond.DELETING), cond.SYNCED: RETRYING},
            writes=["delete"],
            events=[n("Deleting"), w("ReconcileError")],
            requeue=True,
            check=secret_kept,
        ),
        **SETTLED_QUEUE,
        entry="finalize",
        script=fail("delete", errors.RetryableError("Service unavailable", "ServiceUnavailable")),
    ),
    case(
        "delete-foreign-secret",
        "Deletion removes only a Secret that is ours; a foreign one of that name stays.",
        Expect(writes=["delete"], events=[n("Deleted")], release=True),
        **{**SETTLED_QUEUE, "secret": "foreign"},
        entry="finalize",
    ),
    case(
        "delete-paused",
        "Deleting a paused CR waits, without a cloud call, until it is unpaused.",
        Expect(
            conditions={cond.READY: (False, cond.DELETING), cond.SYNCED: (False, cond.PAUSED)},
            cloud_untouched=True,
            events=[n("Deleting"), w("Paused")],
            requeue=True,
            check=cloud_object_kept,
        ),
        **SETTLED_QUEUE,
        annotations=PAUSE,
        entry="finalize",
    ),
    case(
        "delete-paused-namespace-deleted",
        "A paused CR in a namespace being deleted is deleted by its policy: the namespace (and "
        "a CloudAccount waiting for its resources) never hangs on it.",
        Expect(
            writes=["delete"],
            events=[w("PauseOverridden"), n("Deleted")],
            secret_writes=["delete"],
            release=True,
        ),
        **SETTLED_QUEUE,
        annotations=PAUSE,
        entry="finalize",
        namespace_terminating=True,
    ),
]


def assert_owner(world: World, owner: str) -> None:
    assert world.obj is not None
    assert world.obj.tags["provisioner.dev/owner-uid"] == owner


def assert_password(world: World, password: str) -> None:
    assert world.obj is not None and world.obj.password == password
    assert "set_password" not in world.cloud.writes()


def assert_no_kube_calls(world: World) -> None:
    assert [entry for entry in world.journal if entry[0] == "kube"] == []


# -- the test ----------------------------------------------------------------------------------


def check_invariants(world: World) -> None:
    case = world.case
    # No password ever reaches a condition, an Event or the status.
    if isinstance(world.cloud, FakePasswordCloud):
        shown = json.dumps(
            [
                [(e.type, e.reason, e.message) for e in world.events],
                world.patches,
                world.status,
            ]
        )
        for password in world.cloud.passwords:
            assert password not in shown, "a password reached a condition, Event or status"
    # A foreign Secret is never overwritten or deleted.
    if case.secret == "foreign":
        assert world.secret() == world.seeded_secret, "the foreign Secret was touched"
    # Ready and Synced: the Secret holds what the cloud has (the password it last accepted).
    if (
        cond.is_true(world.status, cond.READY)
        and cond.is_true(world.status, cond.SYNCED)
        and world.obj is not None
        and case.entry != "finalize"
    ):
        data = world.secret_data()
        assert data, "Ready and Synced without a connection Secret"
        assert data["arn"] == world.obj.arn
        if isinstance(world.cloud, FakePasswordCloud):
            assert data["password"] == world.obj.password
    # observedGeneration never runs ahead of the object.
    assert int(world.status.get("observedGeneration") or 0) <= case.generation


@pytest.mark.parametrize("case", CASES)
def test_reconciler_case(case: Case) -> None:
    world = run(case)
    expect = case.expect
    why = f"[{case.why}]"
    last = world.results[-1]

    for type_, wanted in expect.conditions.items():
        found = cond.find(world.status.get("conditions"), type_)
        if wanted is None:
            assert found is None, f"{why} {type_} should be absent: {found}"
            continue
        assert found is not None, f"{why} no {type_} condition in {world.status}"
        status, reason = wanted
        got = (found["status"] == "True", found["reason"])
        assert got == (status, reason), f"{why} {type_}: {found}"
    for type_, text in expect.message_has.items():
        found = cond.find(world.status.get("conditions"), type_)
        assert found is not None and text in found["message"], f"{why} {type_}: {found}"

    if expect.cloud_untouched:
        assert world.cloud.calls == [], f"{why} cloud calls: {world.cloud.calls}"
    assert world.cloud.writes() == expect.writes, f"{why} cloud writes"
    if expect.update_fields is not None:
        updates = [c for c in world.cloud.calls if c.method == "update"]
        assert [[d.field for d in c.diffs] for c in updates] == expect.update_fields, why

    events = [(e.type, e.reason) for e in world.events]
    assert events == expect.events, f"{why} Events: {[(e.reason, e.message) for e in world.events]}"
    assert [m for m, _ in world.kube.secret_writes] == expect.secret_writes, f"{why} Secret"

    if expect.skipped:
        assert last is None, f"{why} the pass should have been skipped"
    else:
        assert last is not None, f"{why} the pass was skipped"
        assert (last.requeue_after is not None) == expect.requeue, f"{why} requeue"
        assert last.release_finalizer == expect.release, f"{why} release_finalizer"
    for key, value in expect.status.items():
        wanted_value = world.name if value == EXTERNAL_NAME else value
        assert world.status.get(key) == wanted_value, f"{why} status.{key}: {world.status}"

    if expect.check:
        expect.check(world)
    check_invariants(world)


def test_every_case_says_why() -> None:
    ids = [param.id for param in CASES]
    assert len(ids) == len(set(ids))
    for param in CASES:
        (case,) = param.values
        assert case.why.endswith(".") and len(case.why) > 20, param.id
        assert set(case.entries) <= {"reconcile", "resync", "finalize"}, param.id
