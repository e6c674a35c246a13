{{/* Names, labels and the few derived lists that several templates share. */}}

{{- define "distillery.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "distillery.fullname" -}}
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

{{- define "distillery.operatorName" -}}
{{- printf "%s-operator" (include "distillery.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "distillery.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "distillery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: distillery
{{- end }}

{{- define "distillery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "distillery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "distillery.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "distillery.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "distillery.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespaces the operator watches when not cluster-wide, one per line. */}}
{{- define "distillery.watchedNamespaces" -}}
{{- $namespaces := .Values.watch.namespaces | default (list .Release.Namespace) }}
{{- range $namespaces | uniq }}
{{ . }}
{{- end }}
{{- end }}

{{/* The namespaces that get the runtime's Role and ServiceAccount, one per line. */}}
{{- define "distillery.runtimeNamespaces" -}}
{{- $namespaces := .Values.runtime.namespaces }}
{{- if not $namespaces }}
{{- if .Values.watch.clusterWide }}
{{- $namespaces = list .Release.Namespace }}
{{- else }}
{{- $namespaces = .Values.watch.namespaces | default (list .Release.Namespace) }}
{{- end }}
{{- end }}
{{- range $namespaces | uniq }}
{{ . }}
{{- end }}
{{- end }}
