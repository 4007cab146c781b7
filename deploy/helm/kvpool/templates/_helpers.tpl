{{/*
Names, labels and shared pieces of the kvpool chart.
*/}}

{{- define "kvpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every object: RELEASE-kvpool, or RELEASE when it already contains the chart
name. Object names add "-master" or "-segment", so this stays within 56 characters.
*/}}
{{- define "kvpool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 56 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvpool.masterName" -}}
{{ include "kvpool.fullname" . }}-master
{{- end }}

{{- define "kvpool.segmentName" -}}
{{ include "kvpool.fullname" . }}-segment
{{- end }}

{{- define "kvpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "kvpool.labels" -}}
helm.sh/chart: {{ include "kvpool.chart" . }}
{{ include "kvpool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select this release's pods (add app.kubernetes.io/component). */}}
{{- define "kvpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvpool.image" -}}
{{ required "image.repository is required" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "kvpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvpool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvpool.etcdName" -}}
{{ include "kvpool.fullname" . }}-etcd
{{- end }}

{{/* etcd endpoints of the masters' election: the user's, or the chart's etcd Service. */}}
{{- define "kvpool.etcdEndpoints" -}}
{{- if .Values.highAvailability.etcd.endpoints }}
{{- .Values.highAvailability.etcd.endpoints }}
{{- else }}
{{- include "kvpool.etcdName" . }}.{{ .Release.Namespace }}.svc:{{ int64 .Values.highAvailability.etcd.clientPort }}
{{- end }}
{{- end }}

{{/* Whether the chart runs its own etcd. */}}
{{- define "kvpool.chartEtcd" -}}
{{- if and .Values.highAvailability.enabled (not .Values.highAvailability.etcd.endpoints) }}true{{ end }}
{{- end }}

{{/* gRPC address segments and clients call the master at (with several masters: the leader,
found through etcd). */}}
{{- define "kvpool.masterAddress" -}}
{{- if .Values.segment.masterAddress }}
{{- .Values.segment.masterAddress }}
{{- else if .Values.highAvailability.enabled }}
{{- printf "etcd://%s" (include "kvpool.etcdEndpoints" .) }}
{{- else }}
{{- include "kvpool.masterName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.master.grpcPort }}
{{- end }}
{{- end }}

{{/* "HOST:PORT" a server binds in its pod. */}}
{{- define "kvpool.listen" -}}
{{ .root.Values.listenAddress }}:{{ .port }}
{{- end }}

{{/* Memory of the master container, in MiB: its own plus the embedded segment's pool. */}}
{{- define "kvpool.masterMemoryMiB" -}}
{{ add (int64 .Values.master.memoryMiB) (int64 .Values.master.embeddedSegment.sizeMiB) }}
{{- end }}

{{/*
Memory of a segment container, in MiB: the pool and the process, or only the process when the
pool is allocated from huge pages (hugepages.enabled).
*/}}
{{- define "kvpool.segmentMemoryMiB" -}}
{{- $pool := int64 .Values.segment.pool.sizeMiB }}
{{- $overhead := int64 .Values.segment.pool.overheadMiB }}
{{- if .Values.segment.hugepages.enabled }}
{{- $overhead }}
{{- else }}
{{- add $pool $overhead }}
{{- end }}
{{- end }}

{{/*
Container resources: the user's CPU requests and limits with the computed memory (and huge
pages) added. Arguments: dict "resources" (the values stanza), "memoryMiB", "hugepagesMiB" (0:
none), "what" (for messages).
*/}}
{{- define "kvpool.resources" -}}
{{- $requests := deepCopy (default dict .resources.requests) }}
{{- $limits := deepCopy (default dict .resources.limits) }}
{{- if or (hasKey $requests "memory") (hasKey $limits "memory") }}
{{- fail (printf "%s.resources: do not set memory; it is computed (see values.yaml)" .what) }}
{{- end }}
{{- $memory := printf "%dMi" (int64 .memoryMiB) }}
{{- $_ := set $requests "memory" $memory }}
{{- $_ := set $limits "memory" $memory }}
{{- if gt (int64 .hugepagesMiB) 0 }}
{{- $pages := printf "%dMi" (int64 .hugepagesMiB) }}
{{- $_ := set $requests "hugepages-2Mi" $pages }}
{{- $_ := set $limits "hugepages-2Mi" $pages }}
{{- end -}}
requests:
  {{- toYaml $requests | nindent 2 }}
limits:
  {{- toYaml $limits | nindent 2 }}
{{- end }}

{{/* Values that cannot work together fail the render with a message. */}}
{{- define "kvpool.validate" -}}
{{- if .Values.highAvailability.enabled }}
{{- if gt (int64 .Values.master.embeddedSegment.sizeMiB) 0 }}
{{- fail "highAvailability.enabled needs master.embeddedSegment.sizeMiB 0 (an embedded pool dies with its master; the segments hold the pool)" }}
{{- end }}
{{- if lt (int64 .Values.highAvailability.replicas) 2 }}
{{- fail "highAvailability.replicas must be at least 2 (3 recommended)" }}
{{- end }}
{{- end }}
{{- if and (not .Values.segment.enabled) (eq (int64 .Values.master.embeddedSegment.sizeMiB) 0) }}
{{- fail "the pool has no memory: enable segment (the DaemonSet) or set master.embeddedSegment.sizeMiB" }}
{{- end }}
{{- if and .Values.segment.enabled (le (int64 .Values.segment.pool.sizeMiB) 0) }}
{{- fail "segment.pool.sizeMiB must be above 0" }}
{{- end }}
{{- if and (not .Values.insecure) (not (and .Values.tls.enabled .Values.auth.enabled)) }}
{{- fail "tls.enabled=false or auth.enabled=false lets anyone who reaches the pods own the pool: set insecure=true to mean it (docs/operations.md, \"Security\")" }}
{{- end }}
{{- if and .Values.segment.enabled .Values.segment.hugepages.enabled (ne (mod (int64 .Values.segment.pool.sizeMiB) 2) 0) }}
{{- fail "segment.pool.sizeMiB must be a multiple of 2 (MiB) with hugepages.enabled (2 MiB pages)" }}
{{- end }}
{{- end }}

{{/*
Security (values tls, auth, insecure). kvpool.tlsSource: where the master's certificate comes
from, "certManager", "helm" or "secret" (tls.source=auto: cert-manager when its API is
installed, else helm); empty with TLS off.
*/}}
{{- define "kvpool.tlsSource" -}}
{{- if .Values.tls.enabled }}
{{- $source := .Values.tls.source }}
{{- if eq $source "auto" }}
{{- $source = ternary "certManager" "helm" (.Capabilities.APIVersions.Has "cert-manager.io/v1") }}
{{- end }}
{{- if not (has $source (list "certManager" "helm" "secret")) }}
{{- fail (printf "tls.source: %q is not auto, certManager, helm or secret" $source) }}
{{- end }}
{{- $source }}
{{- end }}
{{- end }}

{{/* Secret with the master's tls.crt, tls.key and its CA's ca.crt. */}}
{{- define "kvpool.tlsSecretName" -}}
{{- if eq (include "kvpool.tlsSource" .) "secret" }}
{{- required "tls.existingSecret is required with tls.source=secret" .Values.tls.existingSecret }}
{{- else }}
{{- include "kvpool.masterName" . }}-tls
{{- end }}
{{- end }}

{{/* Secret with the credentials file ("tokens") and the token files. */}}
{{- define "kvpool.authSecretName" -}}
{{- default (printf "%s-auth" (include "kvpool.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* DNS names of the master's certificate: its Service's names, localhost, and extras. */}}
{{- define "kvpool.masterDnsNames" -}}
{{- $svc := include "kvpool.masterName" . }}
{{- $names := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) "localhost" }}
{{- toJson (concat $names .Values.tls.extraDnsNames) }}
{{- end }}

{{/* Where the pods find the Secrets' files. */}}
{{- define "kvpool.tlsDir" -}}/etc/kvpool-tls{{- end }}
{{- define "kvpool.authDir" -}}/etc/kvpool-auth{{- end }}
