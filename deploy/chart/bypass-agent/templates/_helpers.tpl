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
Memory from maxSockets, as measured (docs/kubernetes.md, Memory): the agent's memory
cgroup after a fresh load held 45 MiB at 65536 sockets and 120 MiB at 262144, about
400 bytes per socket of --max-sockets (the LRU pairing maps sized by it are
preallocated and charged to the agent's cgroup on kernels >= 5.11) over some 20 MiB of
its own. Request: 32 MiB plus the maps; limit: twice that plus 224 MiB for the watch
caches of a large cluster: against an API server holding 10,000 Services with their
EndpointSlices, 1,000 NetworkPolicies, 5,000 Nodes and 150,000 Pods the agent's
resident memory was 130 MiB, and a relist holds a second copy of the Services and
EndpointSlices (results/scale/README.md). CPU, from the same measurement: 4% of a core
with one change to its node's pods a second (request 40m), 7.5% under 300 updates a
second of pods, EndpointSlices and NetworkPolicies (before their passes were coalesced:
44%); the limit, a core, leaves room for a first listing.
*/}}
{{- define "bypass.resources" -}}
{{- if .Values.resources -}}
{{ toYaml .Values.resources }}
{{- else -}}
{{- $maps := div (mul (int64 .Values.maxSockets) 400) 1048576 -}}
requests:
  cpu: 40m
  memory: {{ add 32 $maps }}Mi
limits:
  cpu: "1"
  memory: {{ add 224 (mul 2 (add 32 $maps)) }}Mi
{{- end -}}
{{- end -}}

{{/* Whether the cluster is OpenShift (or the value says so). */}}
{{- define "bypass.openshift" -}}
{{- if eq (toString .Values.openshift.scc) "auto" -}}
{{- if .Capabilities.APIVersions.Has "security.openshift.io/v1" -}}true{{- end -}}
{{- else if eq (toString .Values.openshift.scc) "true" -}}true{{- end -}}
{{- end -}}
