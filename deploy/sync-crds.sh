#!/bin/sh
# Copies the project's CRDs (crds/, the source of truth) into the Helm chart's crds/ directory.
# tests/unit/test_chart_files.py fails when the copies drift; run this after editing crds/.
# The chart's kopf-peering.yaml is not generated: it is kopf's own peering CRDs, kept as is.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/deploy/helm/provisioner/crds"
mkdir -p "$dest"
for crd in "$root"/crds/*.yaml; do
    cp "$crd" "$dest/$(basename "$crd")"
done
echo "copied $(ls "$root"/crds/*.yaml | wc -l) CRDs into $dest"
