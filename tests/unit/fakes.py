"""In-process stand-ins for a cloud service and the Kubernetes API, for reconciler tests.

`FakeCloud` implements the `ExternalClient` protocol over a dict of cloud objects (and
`FakePasswordCloud` adds the `PasswordClient` capability); `FakeKube` implements the few
`Kube` methods the reconciler calls over dicts of Secrets and custom resources. Both record
every call, append to one shared journal (so that tests can assert the order of cloud and
Kubernetes calls), and can be scripted to fail on the nth call of a method.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provisioner.aws import errors
from provisioner.kinds import rds_instance, s3, sqs
from provisioner.kinds.contract import ADOPTABLE_BY_TAG, FieldDiff, Observation
from provisioner.kinds.tagging import tag_diffs
from provisioner.kube.client import KubeError
from provisioner.model.resource import OWNER_UID_TAG, Resource

# The mutable spec fields of each kind, as the real clients name them in their FieldDiffs.
SPEC_FIELDS: dict[str, dict[str, str]] = {
    "Queue": {name: attr for name, attr, _ in sqs.ATTRIBUTES},
    "S3Bucket": {name: attr for name, (attr, _) in s3.FIELDS.items()},
    "DatabaseInstance": {name: attr for name, attr, _ in rds_instance.MUTABLE},
}

# A scripted failure: an exception, or a function of the call's arguments that returns one.
Failure = Exception | Callable[..., Exception]
Journal = list[tuple[str, str, str]]  # (cloud | kube, method, name)


def desired_fields(resource: Resource) -> dict[str, Any]:
    """The field values the spec asks for (tags apart), keyed like the real FieldDiffs."""
    wanted = {
        name: getattr(resource.spec, attr) for name, attr in SPEC_FIELDS[resource.kind].items()
    }
    if resource.kind == "Queue":
        target = resource.resolved.get(sqs.DEAD_LETTER_ARN)
        wanted[sqs.REDRIVE_FIELD] = (
            {"deadLetterTargetArn": target, "maxReceiveCount": resource.spec.max_receive_count}
            if target
            else None
        )
    return wanted


class Script:
    """Failures to raise on the nth call (counted from 1) of a method."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: dict[tuple[str, int], Failure] = {}
        self.always: dict[str, Failure] = {}

    def fail(self, method: str, failure: Failure, nth: int | None = 1) -> None:
        """Raise on the nth call of `method`, or on every call when nth is None."""
        if nth is None:
            self.always[method] = failure
        else:
            self.failures[(method, nth)] = failure

    def check(self, method: str, *args: Any) -> None:
        self.counts[method] += 1
        failure = self.failures.get((method, self.counts[method])) or self.always.get(method)
        if failure is None:
            return
        raise failure if isinstance(failure, Exception) else failure(*args)


@dataclass
class Call:
    method: str
    name: str
    # create: every desired field and the tags; update: field -> desired value.
    fields: dict[str, Any] = field(default_factory=dict)
    diffs: list[FieldDiff] = field(default_factory=list)
    # create: the names of the generated secret values handed over (never the values).
    secrets: tuple[str, ...] = ()


@dataclass
class CloudObject:
    fields: dict[str, Any]
    tags: dict[str, str]
    arn: str
    state: str = "available"
    password: str = ""
    # Observations left before a `deleting` object is gone.
    lingers: int = 0


class FakeCloud:
    """One kind's cloud service: objects by name, every call recorded, failures scripted."""

    def __init__(self, kind: str, *, tags_on_create: bool = True, journal: Journal | None = None):
        self.kind = kind
        self.tags_on_create = tags_on_create
        self.journal: Journal = journal if journal is not None else []
        self.objects: dict[str, CloudObject] = {}
        self.calls: list[Call] = []
        self.script = Script()
        # State of a new object ("creating" keeps it unavailable until changed).
        self.create_state = "available"
        # update() is accepted but the cloud does not show the new values.
        self.hold_updates = False
        # Observations that still see an object after delete() (in state "deleting").
        self.deletion_lingers = 0
        # The message of DeletionBlocked for every delete() (empty: deletion allowed).
        self.block_deletion = ""
        # The next create() stores the object but its answer is lost (a dropped connection).
        self.lose_create_answer = False
        # The next N observations of an existing object miss it (a stale read).
        self.stale_observes = 0
        # create() returns what it made, as the real clients do (None: observe again).
        self.answers_create = False

    # -- seeding and inspection ----------------------------------------------------------

    def seed(
        self,
        resource: Resource,
        *,
        owner: str = "self",
        fields: dict[str, Any] | None = None,
        state: str = "available",
        password: str = "",
        tags: dict[str, str] | None = None,
    ) -> CloudObject:
        """Put an object named like `resource` in the cloud; owner: self, other or none.

        `fields` and `tags` override what the spec asks for (drift, or an older spec).
        """
        found_tags = dict(resource.user_tags)
        if owner == "self":
            found_tags = dict(resource.desired_tags)
        elif owner == "other":
            found_tags = {**resource.desired_tags, OWNER_UID_TAG: "someone-else"}
        found_tags.update(tags or {})
        obj = CloudObject(
            fields={**desired_fields(resource), **(fields or {})},
            tags=found_tags,
            arn=self.arn(resource.external_name),
            state=state,
            password=password,
        )
        self.objects[resource.external_name] = obj
        return obj

    def arn(self, name: str) -> str:
        return f"arn:aws:{self.kind.lower()}:us-east-1:000000000000:{name}"

    def connection(self, name: str, obj: CloudObject) -> dict[str, str]:
        return {
            "name": name,
            "arn": obj.arn,
            "host": f"{name}.example.internal",
            "port": "5432",
            "username": "app",
            "engine": "postgres",
        }

    def writes(self) -> list[str]:
        """The calls that change the cloud, in order."""
        return [c.method for c in self.calls if c.method != "observe"]

    def _record(self, method: str, name: str, **details: Any) -> Call:
        call = Call(method, name, **details)
        self.calls.append(call)
        self.journal.append(("cloud", method, name))
        return call

    # -- ExternalClient -----------------------------------------------------------------

    def observe(self, resource: Resource) -> Observation:
        name = resource.external_name
        self._record("observe", name)
        self.script.check("observe", resource)
        obj = self.objects.get(name)
        if obj is not None and self.stale_observes:
            self.stale_observes -= 1
            obj = None
        return self._observation(resource, obj)

    def _observation(self, resource: Resource, obj: CloudObject | None) -> Observation:
        name = resource.external_name
        if obj is None:
            return Observation(exists=False)
        if obj.state == "deleting":
            if obj.lingers <= 0:
                del self.objects[name]
                return Observation(exists=False)
            obj.lingers -= 1
        wanted = desired_fields(resource)
        diffs = [
            FieldDiff(key, obj.fields.get(key), value)
            for key, value in wanted.items()
            if obj.fields.get(key) != value
        ]
        diffs += tag_diffs(obj.tags, resource.desired_tags)
        return Observation(
            exists=True,
            owner_uid=obj.tags.get(OWNER_UID_TAG, ""),
            adoptable_by=obj.tags.get(ADOPTABLE_BY_TAG, ""),
            available=obj.state in ("available", "modifying"),
            deleting=obj.state == "deleting",
            state=obj.state,
            arn=obj.arn,
            diffs=diffs,
            connection=self.connection(name, obj),
            client_state={"name": name},
        )

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation | None:
        name = resource.external_name
        wanted = desired_fields(resource)
        self._record(
            "create",
            name,
            fields={**wanted, "tags": dict(resource.desired_tags)},
            secrets=tuple(sorted(secrets)),
        )
        self.script.check("create", resource, secrets)
        if name in self.objects:
            raise errors.ConflictError(f"{name} already exists", "AlreadyExists")
        self.objects[name] = CloudObject(
            fields=wanted,
            tags=dict(resource.desired_tags),
            arn=self.arn(name),
            state=self.create_state,
            password=secrets.get("password", ""),
        )
        if self.lose_create_answer:
            self.lose_create_answer = False
            raise errors.RetryableError("connection reset before the answer arrived", "Timeout")
        return self._observation(resource, self.objects[name]) if self.answers_create else None

    def update(self, resource: Resource, observation: Observation, diffs: list[FieldDiff]) -> None:
        name = resource.external_name
        self._record("update", name, fields={d.field: d.desired for d in diffs}, diffs=list(diffs))
        self.script.check("update", resource, diffs)
        obj = self.objects[name]
        if self.hold_updates:
            return
        for diff in diffs:
            if diff.field == "tags":
                obj.tags = dict(diff.desired)
            else:
                obj.fields[diff.field] = diff.desired

    def delete(self, resource: Resource, observation: Observation) -> None:
        name = resource.external_name
        self._record("delete", name)
        self.script.check("delete", resource)
        if self.block_deletion:
            raise errors.DeletionBlocked(self.block_deletion, "BucketNotEmpty")
        obj = self.objects.get(name)
        if obj is None:
            return
        if self.deletion_lingers:
            obj.state, obj.lingers = "deleting", self.deletion_lingers
        else:
            del self.objects[name]


class FakePasswordCloud(FakeCloud):
    """A kind whose master password the operator generates and owns (the PasswordClient)."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        super().__init__(kind, **kwargs)
        # Every password the cloud ever accepted: none may show up in a condition or Event.
        self.passwords: list[str] = []

    def create(self, resource: Resource, secrets: dict[str, str]) -> Observation | None:
        known = super().create(resource, secrets)
        self.passwords.append(secrets["password"])
        return known

    def seed(self, resource: Resource, **kwargs: Any) -> CloudObject:
        obj = super().seed(resource, **kwargs)
        if obj.password:
            self.passwords.append(obj.password)
        return obj

    def set_password(self, resource: Resource, password: str) -> None:
        name = resource.external_name
        self._record("set_password", name)
        self.script.check("set_password", resource, password)
        self.objects[name].password = password
        self.passwords.append(password)

    def with_password(self, connection: dict[str, str], password: str) -> dict[str, str]:
        uri = f"postgresql://app:{password}@{connection['host']}:{connection['port']}/"
        return {**connection, "password": password, "uri": uri}


class FakeKube:
    """Secrets and custom resources in dicts; writes recorded; failures scripted."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal: Journal = journal if journal is not None else []
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.resources: dict[tuple[str, str, str], dict[str, Any]] = {}
        # (create | replace | delete, Secret name), in order.
        self.secret_writes: list[tuple[str, str]] = []
        # (kind, name, patch) of every patch_status call the reconciler made itself.
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.script = Script()
        self._uids = 0
        # Namespaces by name (`get_namespace`); absent: 404 (None).
        self.namespaces: dict[str, dict[str, Any]] = {}

    def get_namespace(self, namespace: str) -> dict[str, Any] | None:
        self._record("get_namespace", namespace)
        return copy.deepcopy(self.namespaces.get(namespace))

    def _record(self, method: str, name: str) -> None:
        self.journal.append(("kube", method, name))
        self.script.check(method, name)

    def put_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store a Secret as the API server would (uid, resourceVersion), without recording."""
        stored = copy.deepcopy(body)
        self._uids += 1
        stored["metadata"].setdefault("uid", f"secret-uid-{self._uids}")
        stored["metadata"]["resourceVersion"] = "1"
        self.secrets[(namespace, stored["metadata"]["name"])] = stored
        return stored

    # -- the Kube methods the reconciler calls ---------------------------------------------

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._record("get_secret", name)
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        self._record("create_secret", name)
        if (namespace, name) in self.secrets:
            raise KubeError(409, "AlreadyExists", f'secrets "{name}" already exists')
        self.secret_writes.append(("create", name))
        return copy.deepcopy(self.put_secret(namespace, body))

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._record("replace_secret", name)
        current = self.secrets.get((namespace, name))
        if current is None:
            raise KubeError(404, "NotFound", f'secrets "{name}" not found')
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = current["metadata"]["uid"]
        stored["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.secrets[(namespace, name)] = stored
        self.secret_writes.append(("replace", name))

    def delete_secret(self, namespace: str, name: str, uid: str | None = None) -> None:
        self._record("delete_secret", name)
        current = self.secrets.get((namespace, name))
        if current is None:
            return
        if uid and current["metadata"]["uid"] != uid:
            return  # the precondition failed: Kube.delete_secret swallows that 409
        del self.secrets[(namespace, name)]
        self.secret_writes.append(("delete", name))

    def get_resource(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._record("get_resource", name)
        found = self.resources.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._record("patch_status", name)
        self.status_patches.append((kind, name, copy.deepcopy(status)))
        self.merge_status(kind, namespace, name, status)

    def merge_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A JSON merge patch of status (top-level keys replaced), as the API server does."""
        body = self.resources.get((kind, namespace, name))
        if body is not None:
            body.setdefault("status", {}).update(copy.deepcopy(status))
