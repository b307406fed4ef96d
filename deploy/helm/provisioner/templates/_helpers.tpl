{{/* Names and labels. */}}
{{- define "provisioner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "provisioner.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "provisioner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "provisioner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "provisioner.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "provisioner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "provisioner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "provisioner.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The conversion webhook's Service and the Secret of its certificate. */}}
{{- define "provisioner.webhookService" -}}
{{- include "provisioner.fullname" . }}-webhook
{{- end }}

{{- define "provisioner.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "provisioner.fullname" .)) .Values.webhook.secretName }}
{{- end }}

{{/*
The CRDs whose conversion the operator keeps pointed at its webhook (its namespaced kinds'):
"databaseinstances.cloud.provisioner.dev, queues.cloud.provisioner.dev, ...".
*/}}
{{- define "provisioner.convertedCrds" -}}
{{- $names := list }}
{{- range splitList ", " (include "provisioner.kindPlurals" .) }}
{{- $names = append $names (printf "%s.cloud.provisioner.dev" .) }}
{{- end }}
{{- join ", " $names }}
{{- end }}

{{/* kopf peering is on with more than one replica, unless sharded ("true" or ""). */}}
{{- define "provisioner.peering" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.sharding.enabled) }}true{{ end }}
{{- end }}

{{/* Several operator pods at once (peering or sharding): rolling updates and a PDB. */}}
{{- define "provisioner.several" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
Checks that fail the render with a message instead of shipping something that cannot work.
*/}}
{{- define "provisioner.validate" -}}
{{- range .Values.watchNamespaces }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" .) }}
{{- fail (printf "watchNamespaces: %q is not a namespace name; globs and patterns are refused because the chart grants a Role in each listed namespace" .) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.access.mode "irsa") (not .Values.access.oidcIssuer) }}
{{- fail "access.mode=irsa needs access.oidcIssuer: the cluster's OIDC issuer URL" }}
{{- end }}
{{- if and (eq .Values.access.mode "pod-identity") (not .Values.access.eksCluster) }}
{{- fail "access.mode=pod-identity needs access.eksCluster: the EKS cluster's name" }}
{{- end }}
{{- end }}

{{/*
The permissions the operator needs on its custom resources and on what it writes next to
them, in the watched namespaces (all of them through a ClusterRole, or a Role in each).
*/}}
{{/*
The plurals of the operator's namespaced kinds, read from the chart's own CRDs (files/crds/),
so that a new kind's CRD is all the RBAC needs: "databaseinstances, queues, s3buckets, ...".
(CloudAccounts, cluster-scoped, have rules of their own: templates/accounts-rbac.yaml.)
*/}}
{{- define "provisioner.kindPlurals" -}}
{{- $plurals := list }}
{{- range $path, $_ := .Files.Glob "files/crds/*.yaml" }}
{{- $crd := $.Files.Get $path | fromYaml }}
{{- if and (eq $crd.spec.group "cloud.provisioner.dev") (eq $crd.spec.scope "Namespaced") }}
{{- $plurals = append $plurals $crd.spec.names.plural }}
{{- end }}
{{- end }}
{{- sortAlpha $plurals | join ", " }}
{{- end }}

{{- define "provisioner.namespacedRules" -}}
{{- $plurals := splitList ", " (include "provisioner.kindPlurals" .) }}
# kopf watches every kind (list + watch) and merge-patches them: its finalizer in
# metadata.finalizers while a resource exists in the cloud.
- apiGroups: [cloud.provisioner.dev]
  resources: [{{ join ", " $plurals }}]
  verbs: [list, watch, patch]
# The operator reads one resource by name: the resource another one depends on (a Queue's
# dead-letter target or the Topics it subscribes to), and each resource's current body at
# its periodic resync; it deletes one whose spec.ttl or spec.expiresAt has come.
- apiGroups: [cloud.provisioner.dev]
  resources: [{{ join ", " $plurals }}]
  verbs: [get, delete]
# Conditions, observedGeneration and kopf's progress are written to the status subresource.
- apiGroups: [cloud.provisioner.dev]
  resources: [{{ range $i, $p := $plurals }}{{ if $i }}, {{ end }}{{ $p }}/status{{ end }}]
  verbs: [patch]
# Connection Secrets are owned by their CR with blockOwnerDeletion: true, which clusters with
# the OwnerReferencesPermissionEnforcement admission plugin allow only to whoever may update
# the owner's finalizers.
- apiGroups: [cloud.provisioner.dev]
  resources: [{{ range $i, $p := $plurals }}{{ if $i }}, {{ end }}{{ $p }}/finalizers{{ end }}]
  verbs: [update]
# Connection Secrets: read one by name, create it, replace it when its content changes,
# delete it when the CR goes. No list or watch: the operator never enumerates Secrets.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, update, delete]
# The operator posts core/v1 Events on its resources.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if eq .Values.access.mode "irsa" }}
# spec.access with IRSA: read a granted ServiceAccount by name, and set or remove its
# eks.amazonaws.com/role-arn annotation. No list, watch, create or delete.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, patch]
{{- end }}
{{- end }}

{{/* kopf peering: keep-alives are merge-patches to one named object, which the resync loop
also reads to stay quiet while a higher-priority replica is active; the rest is watched. */}}
{{- define "provisioner.peeringRules" -}}
{{- $plural := .plural }}
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  resourceNames: [{{ .name | quote }}]
  verbs: [get, patch]
{{- end }}
