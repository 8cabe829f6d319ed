{{/* Chart name, truncated to a DNS label. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "sluice.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the Pods. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the rules. */}}
{{- define "sluice.rulesConfigMap" -}}
{{- if .Values.existingConfigMap }}
{{- .Values.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The replica count Sluice is told (--replicas): with autoscaling, the most pods. */}}
{{- define "sluice.replicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.maxReplicas }}
{{- else }}
{{- .Values.replicaCount }}
{{- end }}
{{- end }}

{{/* Serving threads (--workers): the value, else the CPU limit, else the CPU request,
rounded up to whole cores (at least 1); empty when none is set. */}}
{{- define "sluice.workers" -}}
{{- if .Values.workers }}
{{- .Values.workers }}
{{- else }}
{{- $cpu := "" }}
{{- with .Values.resources }}
{{- if and .limits .limits.cpu }}
{{- $cpu = toString .limits.cpu }}
{{- else if and .requests .requests.cpu }}
{{- $cpu = toString .requests.cpu }}
{{- end }}
{{- end }}
{{- if $cpu }}
{{- $cores := 0.0 }}
{{- if hasSuffix "m" $cpu }}
{{- $cores = divf (trimSuffix "m" $cpu | float64) 1000 }}
{{- else }}
{{- $cores = float64 $cpu }}
{{- end }}
{{- max 1 (ceil $cores | int) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The rules ConfigMap's data: the `rules` value, or with none the example rules, so
that a bare install answers. The rules-check hook checks the same data. */}}
{{- define "sluice.rulesData" -}}
{{- if .Values.rules }}
{{- range $file, $rules := .Values.rules }}
{{ $file }}: |
  {{- if kindIs "string" $rules }}
  {{- $rules | nindent 2 }}
  {{- else }}
  {{- toYaml $rules | nindent 2 }}
  {{- end }}
{{- end }}
{{- else }}
example.yaml: |
  {{- .Files.Get "files/example-rules.yaml" | nindent 2 }}
{{- end }}
{{- end }}
