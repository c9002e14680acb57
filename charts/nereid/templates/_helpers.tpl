{{/*
Names, labels and image strings shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "nereid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release-qualified prefix of every resource name: fullnameOverride, else
the release name when it already contains the chart name (release "nereid"
gives "nereid", not "nereid-nereid"), else "<release>-<chart>". Names are at
most 63 characters (DNS-1123 label).
*/}}
{{- define "nereid.fullname" -}}
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

{{/*
The name of the operator's own objects (Deployment, ClusterRole, Service,
Lease): "<fullname>-operator", so release "nereid" gives "nereid-operator",
the operator's default lease name.
*/}}
{{- define "nereid.operatorName" -}}
{{- printf "%s-operator" (include "nereid.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label ('+' is not allowed in labels). */}}
{{- define "nereid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "nereid.labels" -}}
helm.sh/chart: {{ include "nereid.chart" . }}
{{ include "nereid.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nereid
{{- end }}

{{/*
The labels that select the operator pods. They must never change between
releases: a Deployment's selector is immutable.
*/}}
{{- define "nereid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nereid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount: the one created, or the one named. */}}
{{- define "nereid.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nereid.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference, "<repository>:<tag or appVersion>", and "@<digest>" when
a digest is given: the runtime then pulls exactly that image, whatever the
tag points at now (the tag stays for people reading the manifest).
Called with (list <image values> <context>).
*/}}
{{- define "nereid.imageRef" -}}
{{- $image := index . 0 }}{{- $root := index . 1 }}
{{- $ref := printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- with $image.digest }}
{{- $ref = printf "%s@%s" $ref . }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* The operator image. */}}
{{- define "nereid.image" -}}
{{- include "nereid.imageRef" (list .Values.image .) }}
{{- end }}

{{/* The default serving image handed to the operator (NEREID_SERVER_IMAGE). */}}
{{- define "nereid.serverImage" -}}
{{- include "nereid.imageRef" (list .Values.serverImage .) }}
{{- end }}

{{/* "true" when KEDA's External Scaler service is served over TLS, else empty. */}}
{{- define "nereid.kedaTls" -}}
{{- if and .Values.keda.enabled (not .Values.keda.plaintext) }}true{{ end }}
{{- end }}

{{/*
Stops rendering on values that would deploy a broken operator. Included by
the Deployment, which every install renders.
*/}}
{{- define "nereid.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: without a lease every replica would reconcile the same models at once. Enable leader election or set replicaCount to 1." (int .Values.replicaCount)) }}
{{- end }}
{{- if and (eq .Values.autoscaling.autoscaler "keda") (not .Values.keda.enabled) }}
{{- fail "autoscaling.autoscaler is keda but keda.enabled is false: KEDA's triggers would call an External Scaler service that is not served. Set keda.enabled=true." }}
{{- end }}
{{- if .Values.keda.enabled }}
{{- if and .Values.keda.plaintext .Values.keda.tls.secretName }}
{{- fail "keda.plaintext is true but keda.tls.secretName is set: serve the External Scaler service over TLS or in plaintext, not both." }}
{{- end }}
{{- if and (not .Values.keda.plaintext) (not .Values.keda.tls.secretName) }}
{{- fail "keda.enabled needs keda.tls.secretName (a kubernetes.io/tls Secret for the External Scaler service), or keda.plaintext=true to serve it without TLS, readable by anyone who reaches it." }}
{{- end }}
{{- if and (eq .Values.autoscaling.autoscaler "keda") (not .Values.keda.plaintext) (not .Values.keda.triggerAuthentication) }}
{{- fail "autoscaling.autoscaler is keda with a TLS External Scaler service: set keda.triggerAuthentication to the ClusterTriggerAuthentication that gives KEDA the service's CA (and its client certificate with keda.tls.mutual)." }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The external metrics API's Service, and the Secret of its serving certificate.
*/}}
{{- define "nereid.externalMetricsName" -}}
{{- printf "%s-external-metrics" (include "nereid.operatorName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nereid.externalMetricsSecret" -}}
{{- default (printf "%s-tls" (include "nereid.externalMetricsName" .)) .Values.externalMetrics.tls.secretName }}
{{- end }}

{{/*
nereid-gateway: its objects are named "<fullname>-gateway" and labeled as
the chart's with component "gateway".
*/}}
{{- define "nereid.gatewayName" -}}
{{- printf "%s-gateway" (include "nereid.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The labels that select the gateway pods; immutable like the operator's. */}}
{{- define "nereid.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ include "nereid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The labels every gateway object carries. */}}
{{- define "nereid.gatewayLabels" -}}
helm.sh/chart: {{ include "nereid.chart" . }}
{{ include "nereid.gatewaySelectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nereid
{{- end }}

{{/*
The namespaces whose models the gateway serves: its own list, else the
operator's watchNamespaces; empty means all.
*/}}
{{- define "nereid.gatewayNamespaces" -}}
{{- join "," (default .Values.watchNamespaces .Values.gateway.namespaces) }}
{{- end }}

{{/*
Where the gateway's namespace tokens are mounted: one folder per
gateway.namespaceTokens entry, by its index, holding the file "token".
*/}}
{{- define "nereid.gatewayTokenDir" -}}
/var/run/nereid-gateway/namespace-tokens
{{- end }}

{{/* Stops rendering on gateway values that would deploy a broken gateway. */}}
{{- define "nereid.gatewayValidate" -}}
{{- $gateway := .Values.gateway }}
{{- if le (int $gateway.terminationGracePeriodSeconds) (add (int $gateway.drainDelaySeconds) 2) }}
{{- fail (printf "gateway.terminationGracePeriodSeconds (%d) must exceed gateway.drainDelaySeconds (%d) by more than 2 s: the requests in flight need time to finish after the drain." (int $gateway.terminationGracePeriodSeconds) (int $gateway.drainDelaySeconds)) }}
{{- end }}
{{- if and $gateway.autoscaling.enabled (not (dig "requests" "cpu" "" $gateway.resources)) }}
{{- fail "gateway.autoscaling.enabled needs gateway.resources.requests.cpu: an HPA on CPU utilisation measures against the request." }}
{{- end }}
{{- end }}
