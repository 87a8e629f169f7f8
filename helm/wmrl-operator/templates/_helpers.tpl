{{/* The chart's name, overridable. */}}
{{- define "wmrl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. `helm install wmrl` gives "wmrl-operator"
(the same names as manifests/install.yaml); other release names are prefixed.
*/}}
{{- define "wmrl-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "wmrl-operator.name" . }}
{{- if contains .Release.Name $name }}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "wmrl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wmrl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "wmrl-operator.labels" -}}
{{ include "wmrl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: wmrl
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "wmrl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "wmrl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "repository:tag", the tag defaulting to the chart's appVersion. Call with (list $image $root). */}}
{{- define "wmrl-operator.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{- define "wmrl-operator.calibrationImage" -}}
{{- if .Values.calibrationImage.repository }}
{{- include "wmrl-operator.image" (list .Values.calibrationImage .) }}
{{- else }}
{{- include "wmrl-operator.image" (list .Values.image .) }}
{{- end }}
{{- end }}

{{/* The generated RBAC rules (files/rbac.yaml, written by wmrl/api/generate.py from operator/wmrl_operator/rbac.py). */}}
{{- define "wmrl-operator.rules" -}}
{{- .Files.Get "files/rbac.yaml" }}
{{- end }}

{{- define "wmrl-operator.webhookService" -}}
{{- printf "%s-webhook" (include "wmrl-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
