{{/* Names */}}
{{- define "fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of one component's objects: <fullname>-worker, <fullname>-sink, ... (52 chars leave room for suffixes) */}}
{{- define "fleet.componentName" -}}
{{- printf "%s-%s" (include "fleet.fullname" .root | trunc 52 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "fleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleet.labels" -}}
helm.sh/chart: {{ include "fleet.chart" .root }}
{{ include "fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: entitlement-fleet
{{- end -}}

{{- define "fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Referenced objects the user creates */}}
{{- define "fleet.rootCertificatesName" -}}
{{- default (printf "%s-apple-roots" (include "fleet.fullname" .)) .Values.rootCertificates.name -}}
{{- end -}}

{{- define "fleet.databaseSecretName" -}}
{{- default (printf "%s-database" (include "fleet.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "fleet.productsConfigMapName" -}}
{{- default (printf "%s-products" (include "fleet.fullname" .)) .Values.products.existingConfigMap -}}
{{- end -}}

{{- define "fleet.hasProducts" -}}
{{- if or .Values.products.existingConfigMap .Values.products.catalogue -}}true{{- end -}}
{{- end -}}

{{/* Fixed paths inside the pods (CONTRACTS.md) */}}
{{- define "fleet.configPath" -}}/etc/fleet/fleet.yaml{{- end -}}
{{- define "fleet.rootsDir" -}}/etc/fleet/roots{{- end -}}
{{- define "fleet.productsPath" -}}/etc/fleet/products/products.yaml{{- end -}}
{{- define "fleet.kafkaTLSDir" -}}/etc/fleet/kafka-tls{{- end -}}
{{- define "fleet.ingestTokenDir" -}}/etc/fleet/ingest-token{{- end -}}

{{/* librdkafka sasl.mechanisms -> KEDA kafka scaler `sasl` */}}
{{- define "fleet.kedaSaslMode" -}}
{{- $m := .Values.kafkaAuth.sasl.mechanism -}}
{{- if eq $m "PLAIN" -}}plaintext
{{- else if eq $m "SCRAM-SHA-256" -}}scram_sha256
{{- else if eq $m "SCRAM-SHA-512" -}}scram_sha512
{{- else -}}{{- fail (printf "kafkaAuth.sasl.mechanism %q is not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)" $m) -}}
{{- end -}}
{{- end -}}

{{/*
The fleet.yaml the ConfigMap carries: config.* plus the keys the chart manages
(security properties from kafkaAuth, mounted root certificates, the mounted catalogue).
*/}}
{{- define "fleet.configDocument" -}}
{{- $kafka := deepCopy .Values.config.kafka -}}
{{- $derived := dict -}}
{{- $sasl := .Values.kafkaAuth.sasl -}}
{{- $tls := .Values.kafkaAuth.tls -}}
{{- if and $sasl.enabled $tls.enabled -}}
{{- $_ := set $derived "security.protocol" "SASL_SSL" -}}
{{- else if $sasl.enabled -}}
{{- $_ := set $derived "security.protocol" "SASL_PLAINTEXT" -}}
{{- else if $tls.enabled -}}
{{- $_ := set $derived "security.protocol" "SSL" -}}
{{- end -}}
{{- if $sasl.enabled -}}
{{- $_ := set $derived "sasl.mechanisms" $sasl.mechanism -}}
{{- end -}}
{{- if $tls.enabled -}}
{{- if $tls.caKey -}}
{{- $_ := set $derived "ssl.ca.location" (printf "%s/%s" (include "fleet.kafkaTLSDir" .) $tls.caKey) -}}
{{- end -}}
{{- if $tls.certKey -}}
{{- $_ := set $derived "ssl.certificate.location" (printf "%s/%s" (include "fleet.kafkaTLSDir" .) $tls.certKey) -}}
{{- $_ := set $derived "ssl.key.location" (printf "%s/%s" (include "fleet.kafkaTLSDir" .) $tls.keyKey) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $kafka "properties" (merge (deepCopy (default dict .Values.config.kafka.properties)) $derived) -}}
{{- $worker := deepCopy .Values.config.worker -}}
{{- $roots := list -}}
{{- range .Values.rootCertificates.files -}}
{{- $roots = append $roots (printf "%s/%s" (include "fleet.rootsDir" $) .) -}}
{{- end -}}
{{- $_ := set $worker "root-certificate" $roots -}}
{{- $intermediates := list -}}
{{- range .Values.rootCertificates.intermediateFiles -}}
{{- $intermediates = append $intermediates (printf "%s/%s" (include "fleet.rootsDir" $) .) -}}
{{- end -}}
{{- if $intermediates -}}
{{- $_ := set $worker "trusted-intermediate" $intermediates -}}
{{- end -}}
{{- if include "fleet.hasProducts" . -}}
{{- $_ := set $worker "products" (include "fleet.productsPath" .) -}}
{{- end -}}
{{- $doc := dict "kafka" $kafka "worker" $worker "sink" (deepCopy .Values.config.sink) -}}
{{- if .Values.ingest.enabled -}}
{{- $ingest := deepCopy (default dict .Values.config.ingest) -}}
{{- if .Values.ingest.apiToken.existingSecret -}}
{{- $_ := set $ingest "api-token-file" (printf "%s/%s" (include "fleet.ingestTokenDir" .) .Values.ingest.apiToken.key) -}}
{{- end -}}
{{- $_ := set $doc "ingest" $ingest -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}

{{/* Pod-level pieces shared by the worker and the sink. Arguments: root, component, spec (worker|sink values) */}}
{{- define "fleet.podAnnotations" -}}
checksum/config: {{ include "fleet.configDocument" .root | sha256sum }}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .spec.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fleet.topologySpread" -}}
{{- if .spec.topologySpread.enabled }}
topologySpreadConstraints:
{{- range .spec.topologySpread.topologyKeys }}
  - maxSkew: {{ $.spec.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $.spec.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "fleet.selectorLabels" (dict "root" $.root "component" $.component) | nindent 8 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "fleet.scheduling" -}}
{{- with .spec.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "fleet.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: {{ .spec.probes.liveness.initialDelaySeconds }}
  periodSeconds: {{ .spec.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ .spec.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ .spec.probes.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  initialDelaySeconds: {{ .spec.probes.readiness.initialDelaySeconds }}
  periodSeconds: {{ .spec.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ .spec.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ .spec.probes.readiness.failureThreshold }}
{{- end -}}

{{- define "fleet.preStop" -}}
{{- if gt (int .spec.preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ .spec.preStopSleepSeconds }}"]
{{- end }}
{{- end -}}

{{/* Graceful shutdown: the grace period must outlast preStop + the process's own deadline. */}}
{{- define "fleet.checkGrace" -}}
{{- $deadline := int .deadline -}}
{{- $grace := int .spec.terminationGracePeriodSeconds -}}
{{- $preStop := int .spec.preStopSleepSeconds -}}
{{- if le $grace (add $deadline $preStop) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must be greater than config.%s.shutdown-deadline-seconds (%d) + %s.preStopSleepSeconds (%d), or Kubernetes kills the pod before it has committed its offsets" .component $grace .component $deadline .component $preStop) -}}
{{- end -}}
{{- end -}}

{{/* Kafka SASL credentials as librdkafka pass-through environment variables */}}
{{- define "fleet.kafkaAuthEnv" -}}
{{- if .Values.kafkaAuth.sasl.enabled }}
- name: FLEET_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ required "kafkaAuth.sasl.existingSecret is required when kafkaAuth.sasl.enabled" .Values.kafkaAuth.sasl.existingSecret }}
      key: {{ .Values.kafkaAuth.sasl.usernameKey }}
- name: FLEET_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafkaAuth.sasl.existingSecret }}
      key: {{ .Values.kafkaAuth.sasl.passwordKey }}
{{- end }}
{{- end -}}

{{- define "fleet.kafkaTLSFiles" -}}
{{- $tls := .Values.kafkaAuth.tls -}}
{{- if and $tls.enabled (or $tls.caKey $tls.certKey) -}}true{{- end -}}
{{- end -}}

{{- define "fleet.kafkaTLSVolume" -}}
{{- if include "fleet.kafkaTLSFiles" . }}
- name: kafka-tls
  secret:
    secretName: {{ required "kafkaAuth.tls.existingSecret is required when kafkaAuth.tls.enabled with a caKey or certKey" .Values.kafkaAuth.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "fleet.kafkaTLSVolumeMount" -}}
{{- if include "fleet.kafkaTLSFiles" . }}
- name: kafka-tls
  mountPath: {{ include "fleet.kafkaTLSDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "fleet.databaseURLEnv" -}}
- name: FLEET_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "fleet.databaseSecretName" . }}
      key: {{ .Values.database.urlKey }}
{{- end -}}

{{/* KEDA needs a TriggerAuthentication when there is a secret to hand it: SASL credentials or TLS files. */}}
{{- define "fleet.kedaNeedsAuth" -}}
{{- if or .Values.kafkaAuth.sasl.enabled (include "fleet.kafkaTLSFiles" .) -}}true{{- end -}}
{{- end -}}
