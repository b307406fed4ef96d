#!/bin/sh
# Copies the project's CRDs (crds/, the source of truth) into the Helm chart's files/crds/,
# which templates/crds.yaml renders (so that `helm upgrade` upgrades them, unlike Helm's crds/
# directory). tests/unit/test_chart_files.py fails when the copies drift; run this after
# editing crds/ (the namespaced kinds' v1beta1 entries are written by
# `python -m provisioner_dev.crdgen`), and deploy/render.sh after it.
# The chart's crds/kopf-peering.yaml is not copied from here: it is kopf's own peering CRDs,
# kept as is in Helm's crds/ directory, which Helm installs before the templates (the chart's
# ClusterKopfPeering or KopfPeering objects need them to exist first).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/deploy/helm/provisioner/files/crds"
mkdir -p "$dest"
rm -f "$dest"/*.yaml
for crd in "$root"/crds/*.yaml; do
    cp "$crd" "$dest/$(basename "$crd")"
done
echo "copied $(ls "$root"/crds/*.yaml | wc -l) CRDs into $dest"
