"""`provisioner migrate-storage` without a cluster: which Secrets change, the line printed, and
the walk over a CRD's objects against an API in a dict (pages, conflicts, deletions)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import GROUP
from provisioner.kube.client import KubeError
from provisioner.tools import migrate
from provisioner_dev.processes import free_port

CRD = f"s3buckets.{GROUP}"
CRD_PATH = f"{migrate.CRD_API}/{CRD}"


def owned(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "s", "namespace": "ns", "ownerReferences": list(refs)}}


def ref(api_version: str, kind: str = "S3Bucket", uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": "b",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- which Secrets change -----------------------------------------------------------------------


def test_an_owner_at_an_older_version_moves_to_the_storage_version_and_nothing_else_changes():
    refs = migrate.rewritten_owner_references(
        owned(ref(f"{GROUP}/v1alpha1")), GROUP, "S3Bucket", "v1beta1"
    )
    assert refs == [{**ref(f"{GROUP}/v1beta1")}]


def test_a_secret_already_at_the_storage_version_is_left_alone():
    secret = owned(ref(f"{GROUP}/v1beta1"))
    assert migrate.rewritten_owner_references(secret, GROUP, "S3Bucket", "v1beta1") is None


@pytest.mark.parametrize(
    "other",
    [
        ref("v1", kind="ConfigMap"),  # not ours
        ref(f"{GROUP}/v1alpha1", kind="Queue"),  # another CRD's kind: migrated with that one
        ref(f"{GROUP}/v1alpha1", kind="CloudAccount"),
        ref("other.example.com/v1alpha1"),  # another group, same kind name
    ],
)
def test_owners_of_other_kinds_or_groups_are_left_alone(other):
    assert migrate.rewritten_owner_references(owned(other), GROUP, "S3Bucket", "v1beta1") is None


def test_without_owners_nothing_changes():
    assert migrate.rewritten_owner_references({"metadata": {}}, GROUP, "S3Bucket", "v1") is None


def test_only_the_matching_reference_of_several_changes_and_the_input_is_untouched():
    secret = owned(ref("v1", kind="ConfigMap", uid="c"), ref(f"{GROUP}/v1alpha1"))
    before = copy.deepcopy(secret)
    refs = migrate.rewritten_owner_references(secret, GROUP, "S3Bucket", "v1beta1")
    assert refs == [ref("v1", kind="ConfigMap", uid="c"), ref(f"{GROUP}/v1beta1")]
    assert secret == before


# -- the line printed ---------------------------------------------------------------------------


def test_the_line_of_a_crd():
    outcome = migrate.Outcome(
        crd=f"databaseinstances.{GROUP}",
        version="v1beta1",
        objects=12,
        secrets=3,
        stored=["v1beta1"],
        was=["v1alpha1", "v1beta1"],
    )
    assert migrate.report_line(outcome) == (
        f"databaseinstances.{GROUP}: 12 objects rewritten at v1beta1, 3 Secrets updated, "
        "storedVersions [v1beta1] (was [v1alpha1, v1beta1])"
    )


def test_the_line_counts_one_in_the_singular_and_none_in_the_plural():
    outcome = migrate.Outcome(CRD, "v1beta1", 1, 0, ["v1beta1"], ["v1beta1"])
    assert migrate.report_line(outcome) == (
        f"{CRD}: 1 object rewritten at v1beta1, 0 Secrets updated, "
        "storedVersions [v1beta1] (was [v1beta1])"
    )


# -- which CRDs ---------------------------------------------------------------------------------


def test_all_four_crds_by_default():
    assert migrate.resolve_names(None) == [
        f"{p}.{GROUP}" for p in ("databaseinstances", "s3buckets", "queues", "topics")
    ]


def test_crds_by_full_name_or_plural_once_each():
    assert migrate.resolve_names(["queues", f"topics.{GROUP}", "queues"]) == [
        f"queues.{GROUP}",
        f"topics.{GROUP}",
    ]


@pytest.mark.parametrize("name", ["cloudaccounts", f"cloudaccounts.{GROUP}", "deployments.apps"])
def test_other_crds_are_refused(name):
    with pytest.raises(migrate.MigrationError, match="unknown CRD"):
        migrate.resolve_names([name])


def test_the_storage_version_is_the_one_marked_so():
    crd = {
        "metadata": {"name": CRD},
        "spec": {
            "versions": [
                {"name": "v1alpha1", "served": True, "storage": False},
                {"name": "v1beta1", "served": True, "storage": True},
            ]
        },
    }
    assert migrate.storage_version(crd) == "v1beta1"


# -- the walk, against an API in a dict ---------------------------------------------------------


class FakeApi:
    """The few paths the migration uses: listing (paged), GET and PUT with resourceVersion
    checks, the CRD and its status."""

    def __init__(self, page_limit: int = 2) -> None:
        self.page_limit = page_limit
        self.objects: dict[str, dict[str, Any]] = {}  # path -> body
        self.crd: dict[str, Any] = {
            "metadata": {"name": CRD, "resourceVersion": "1"},
            "spec": {
                "names": {"plural": "s3buckets", "kind": "S3Bucket"},
                "versions": [
                    {"name": "v1alpha1", "served": True, "storage": False},
                    {"name": "v1beta1", "served": True, "storage": True},
                ],
            },
            "status": {"storedVersions": ["v1alpha1", "v1beta1"]},
        }
        self.puts: list[str] = []
        self.rv = 10
        # Before a PUT of these paths: (what happens to the object) once each.
        self.before_put: dict[str, str] = {}
        self.expire_continue_once = False

    def add(self, path: str, body: dict[str, Any]) -> None:
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[path] = body

    def bucket(self, namespace: str, name: str) -> str:
        path = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/s3buckets/{name}"
        self.add(
            path,
            {
                "apiVersion": f"{GROUP}/v1beta1",
                "kind": "S3Bucket",
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
                "spec": {},
            },
        )
        return path

    def secret(self, namespace: str, name: str, *refs: dict[str, Any]) -> str:
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self.add(
            path,
            {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/managed-by": "provisioner"},
                    "ownerReferences": list(refs),
                },
                "data": {},
            },
        )
        return path

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | list[Any] | None = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any] | None:
        q = dict(query or [])
        if path == CRD_PATH and method == "GET":
            return copy.deepcopy(self.crd)
        if path == f"{CRD_PATH}/status" and method == "PUT":
            assert isinstance(body, dict)
            if body["metadata"]["resourceVersion"] != self.crd["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", "the object has been modified")
            self.crd["status"] = copy.deepcopy(body["status"])
            self.crd["metadata"]["resourceVersion"] = str(
                int(self.crd["metadata"]["resourceVersion"]) + 1
            )
            return copy.deepcopy(self.crd)
        if method == "GET" and path in (
            "/apis/cloud.provisioner.dev/v1beta1/s3buckets",
            "/api/v1/secrets",
        ):
            assert int(q["limit"]) > 0
            if path.endswith("secrets"):
                assert q["labelSelector"] == "app.kubernetes.io/managed-by=provisioner"
                return self._paged(lambda p: "/secrets/" in p, q)
            return self._paged(lambda p: "/s3buckets/" in p, q)
        if method == "GET":
            found = self.objects.get(path)
            return copy.deepcopy(found) if found is not None else None
        if method == "PUT":
            assert isinstance(body, dict)
            assert body.get("apiVersion") and body.get("kind"), "a write names its type"
            happens = self.before_put.pop(path, None)
            if happens == "modified":
                self.add(path, self.objects[path])
            elif happens == "deleted":
                del self.objects[path]
            current = self.objects.get(path)
            if current is None:
                return None
            if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", "the object has been modified")
            self.puts.append(path)
            self.add(path, copy.deepcopy(body))
            return copy.deepcopy(self.objects[path])
        raise AssertionError(f"unexpected {method} {path}")

    def _paged(self, wanted: Any, q: dict[str, str]) -> dict[str, Any]:
        """Pages in key order; the continue token is the last key given (as etcd's is)."""
        after = q.get("continue") or ""
        if after and self.expire_continue_once:
            self.expire_continue_once = False
            raise KubeError(410, "Expired", "the continue token expired")
        items = sorted((p, b) for p, b in self.objects.items() if wanted(p) and p > after)
        page = items[: self.page_limit]
        meta = {"continue": page[-1][0]} if len(items) > self.page_limit else {}
        # Items of a list carry no kind of their own.
        bodies = [{k: v for k, v in copy.deepcopy(b).items() if k != "kind"} for _, b in page]
        return {"metadata": meta, "items": bodies}


def migration(api: FakeApi) -> migrate.Migration:
    return migrate.Migration(api)  # type: ignore[arg-type]


def test_every_object_over_several_pages_is_written_back_then_stored_versions_set():
    api = FakeApi(page_limit=2)
    paths = [api.bucket("a", f"b{i}") for i in range(5)]
    outcome = migration(api).migrate(CRD)
    assert sorted(api.puts) == sorted(paths)
    assert outcome == migrate.Outcome(CRD, "v1beta1", 5, 0, ["v1beta1"], ["v1alpha1", "v1beta1"])
    assert api.crd["status"]["storedVersions"] == ["v1beta1"]


def test_a_conflict_is_read_again_and_written_and_a_deleted_object_is_skipped():
    api = FakeApi()
    changed = api.bucket("a", "changed")
    gone = api.bucket("a", "gone")
    kept = api.bucket("b", "kept")
    api.before_put = {changed: "modified", gone: "deleted"}
    outcome = migration(api).migrate(CRD)
    assert api.puts == [changed, kept]
    assert outcome.objects == 2


def test_an_expired_continue_token_lists_again_without_writing_twice():
    api = FakeApi(page_limit=1)
    paths = [api.bucket("a", f"b{i}") for i in range(3)]
    api.expire_continue_once = True
    outcome = migration(api).migrate(CRD)
    assert sorted(api.puts) == paths
    assert outcome.objects == 3


def test_only_secrets_owned_by_the_kind_at_an_older_version_are_written():
    api = FakeApi()
    api.bucket("a", "b")
    old = api.secret("a", "old", ref(f"{GROUP}/v1alpha1"))
    api.secret("a", "new", ref(f"{GROUP}/v1beta1"))
    api.secret("a", "queue", ref(f"{GROUP}/v1alpha1", kind="Queue"))
    outcome = migration(api).migrate(CRD)
    assert outcome.secrets == 1
    assert [p for p in api.puts if "/secrets/" in p] == [old]
    assert api.objects[old]["metadata"]["ownerReferences"] == [ref(f"{GROUP}/v1beta1")]
    assert api.objects[old]["apiVersion"] == "v1" and api.objects[old]["kind"] == "Secret"


def test_a_crd_changed_meanwhile_conflicts_once_then_its_status_is_set():
    api = FakeApi()
    m = migration(api)
    real = api.request

    def bump_once(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == f"{CRD_PATH}/status" and not getattr(bump_once, "done", False):
            bump_once.done = True  # type: ignore[attr-defined]
            api.crd["metadata"]["resourceVersion"] = "99"  # a new caBundle, say
            raise KubeError(409, "Conflict", "the object has been modified")
        return real(method, path, *args, **kwargs)

    api.request = bump_once
    assert m.migrate(CRD).stored == ["v1beta1"]


def test_a_storage_version_changed_during_the_migration_stops_it():
    api = FakeApi()
    api.bucket("a", "b")
    m = migration(api)
    real = api.request

    def switch(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if method == "PUT" and "/s3buckets/" in path:
            for v in api.crd["spec"]["versions"]:
                v["storage"] = v["name"] == "v1alpha1"
        return real(method, path, *args, **kwargs)

    api.request = switch
    with pytest.raises(migrate.MigrationError, match="storage version changed"):
        m.migrate(CRD)
    assert api.crd["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]


# -- the command's errors: one line, exit 1 -----------------------------------------------------


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_an_unreachable_api_server_is_one_line_and_exit_1(tmp_path, capsys):
    path = kubeconfig(tmp_path / "config", f"https://127.0.0.1:{free_port()}")
    assert migrate.main(str(path), None) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("provisioner migrate-storage: cannot reach the API server")


def test_a_missing_kubeconfig_is_one_line_and_exit_1(tmp_path, capsys):
    assert migrate.main(str(tmp_path / "nothing"), None) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"provisioner migrate-storage: no kubeconfig at {tmp_path}/nothing\n")


def test_an_unknown_crd_is_one_line_and_exit_1(capsys):
    assert migrate.main("/nonexistent", ["cloudaccounts"]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("provisioner migrate-storage: unknown CRD 'cloudaccounts'")
