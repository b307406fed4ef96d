"""An existing cluster that `dev up --kubeconfig` uses: checked before the CRDs go in, and
left as it was found by `dev down`."""

from __future__ import annotations

import json
from pathlib import Path

from provisioner import FINALIZER
from provisioner_dev import admission
from provisioner_dev.crds import crd_names
from provisioner_dev.devstate import OPERATOR, DevState
from provisioner_dev.kubectl import cluster_answers, run_kubectl
from provisioner_dev.processes import stop


def check_cluster(kubeconfig: Path) -> list[str]:
    """The CRDs `dev up --kubeconfig` installs in the cluster in `kubeconfig`; a RuntimeError
    when that cluster does not answer or has any of them already."""
    if not kubeconfig.is_file():
        raise RuntimeError(f"no kubeconfig at {kubeconfig}")
    why = cluster_answers(kubeconfig)
    if why:
        raise RuntimeError(f"cannot reach the cluster in {kubeconfig}: {why}")
    wanted = crd_names()
    listed = run_kubectl(kubeconfig, "get", "crd", "-o", "name")
    if listed.returncode != 0:
        raise RuntimeError(f"cannot list CRDs in {kubeconfig}: {listed.stderr.strip()}")
    present = sorted(set(wanted) & {line.split("/", 1)[-1] for line in listed.stdout.split()})
    if present:
        raise RuntimeError(
            f"the cluster in {kubeconfig} already has {', '.join(present)}: another "
            "installation may be acting on them; `dev up --kubeconfig` uses a cluster "
            "without them, so that it never acts on custom resources it did not create"
        )
    return wanted


def remove_from_cluster(state: dict) -> None:
    """Take out of an existing cluster exactly what `dev up --kubeconfig` put there: the
    CRDs it installed, and with them every custom resource of theirs (the connection
    Secrets go with their owners, by the cluster's garbage collector). The operator is
    stopped first; our finalizer is taken off what is left, since the cloud (this dev
    environment's moto) goes away too. Nothing else in the cluster is touched."""
    kubeconfig = state["kubeconfig"]
    operator = state.get("processes", {}).get(OPERATOR)
    if operator and DevState.is_alive(operator):
        stop(operator["pid"], timeout=15.0)
    installed = state.get("installed_crds") or []
    if not installed or cluster_answers(kubeconfig):
        return
    owners: set[str] = set()
    for crd in installed:
        found = run_kubectl(kubeconfig, "get", crd, "-A", "-o", "json")
        items = json.loads(found.stdout).get("items", []) if found.returncode == 0 else []
        for item in items:
            meta = item["metadata"]
            owners.add(meta["uid"])
            finalizers = meta.get("finalizers") or []
            if FINALIZER not in finalizers:
                continue
            index = finalizers.index(FINALIZER)
            run_kubectl(
                kubeconfig,
                "patch",
                crd,
                meta["name"],
                "-n",
                meta["namespace"],
                "--type=json",
                f'-p=[{{"op":"test","path":"/metadata/finalizers/{index}",'
                f'"value":"{FINALIZER}"}},'
                f'{{"op":"remove","path":"/metadata/finalizers/{index}"}}]',
            )
        run_kubectl(kubeconfig, "delete", crd, "--all", "-A", "--timeout=60s")
    _remove_secrets(kubeconfig, owners)
    run_kubectl(kubeconfig, "delete", "crd", *installed, "--ignore-not-found", "--timeout=120s")
    # The chart's policies and roles it applied (cluster-scoped, named provisioner-dev-*).
    admission.remove(kubeconfig, state)


def _remove_secrets(kubeconfig: str, owners: set[str]) -> None:
    """The connection Secrets of `owners` (uids): the garbage collector cannot resolve an
    owner whose kind is gone, so it would keep them once the CRDs are deleted."""
    found = run_kubectl(
        kubeconfig, "get", "secrets", "-A", "-l", "app.kubernetes.io/managed-by=provisioner",
        "-o", "json",
    )  # fmt: skip
    secrets = json.loads(found.stdout).get("items", []) if found.returncode == 0 else []
    for secret in secrets:
        meta = secret["metadata"]
        if {ref.get("uid") for ref in meta.get("ownerReferences") or []} & owners:
            run_kubectl(
                kubeconfig, "delete", "secret", meta["name"], "-n", meta["namespace"],
                "--ignore-not-found",
            )  # fmt: skip
