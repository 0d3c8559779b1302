{{/* The name of the DaemonSet, its ServiceAccount and the name label. */}}
{{- define "bypass.name" -}}
{{- default "bypass-agent" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Cluster-scoped objects: the release name, and the name when it is not in it. */}}
{{- define "bypass.fullname" -}}
{{- $name := include "bypass.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "bypass.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bypass.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The recommended labels (kubernetes.io/docs: common labels) and helm.sh/chart. */}}
{{- define "bypass.labels" -}}
{{ include "bypass.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: bypass
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* registry/repository:tag, or @digest when one is given. */}}
{{- define "bypass.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}{{- $repo = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repo -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* skipPorts as the flag's value: a list, one port, or none. */}}
{{- define "bypass.skipPorts" -}}
{{- $p := .Values.skipPorts -}}
{{- if kindIs "slice" $p -}}
{{- if $p -}}{{- join "," $p -}}{{- else -}}none{{- end -}}
{{- else -}}
{{- $p -}}
{{- end -}}
{{- end -}}

{{/*
Memory from maxSockets: the agent's own use plus the BPF maps (preallocated LRU maps
sized by maxSockets, charged to the agent's memory cgroup on kernels >= 5.11), as
measured with memory.current (README, Kubernetes: memory).
*/}}
{{- define "bypass.resources" -}}
{{- if .Values.resources -}}
{{ toYaml .Values.resources }}
{{- else -}}
{{- $maps := div (mul (int64 .Values.maxSockets) 1000) 1048576 -}}
requests:
  cpu: 20m
  memory: {{ add 48 $maps }}Mi
limits:
  cpu: "1"
  memory: {{ add 160 (mul $maps 2) }}Mi
{{- end -}}
{{- end -}}

{{/* Whether the cluster is OpenShift (or the value says so). */}}
{{- define "bypass.openshift" -}}
{{- if eq (toString .Values.openshift.scc) "auto" -}}
{{- if .Capabilities.APIVersions.Has "security.openshift.io/v1" -}}true{{- end -}}
{{- else if eq (toString .Values.openshift.scc) "true" -}}true{{- end -}}
{{- end -}}
