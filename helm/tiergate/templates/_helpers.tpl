{{/* Names ---------------------------------------------------------------------------------- */}}

{{- define "tiergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tiergate.fullname" -}}
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

{{- define "tiergate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tiergate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tiergate.secretName" -}}
{{- default (printf "%s-secrets" (include "tiergate.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* The Secret holding the in-chart Redis's password, and its key. */}}
{{- define "tiergate.redisAuthSecret" -}}
{{- default (printf "%s-redis-auth" (include "tiergate.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{- define "tiergate.redisAuthKey" -}}
{{- default "redis-password" .Values.redis.auth.existingSecretKey -}}
{{- end -}}

{{/*
The in-chart Redis's password when the chart makes its Secret: the one already in the cluster
(so an upgrade keeps it), else 40 fresh random letters and digits. Offline renders (`helm
template`) cannot look it up and get a new one each time: pods roll with it (checksum
annotations), or give redis.auth.existingSecret.
*/}}
{{- define "tiergate.redisPassword" -}}
{{- if not (hasKey .Values "__tiergateRedisPassword") -}}
{{- $password := randAlphaNum 40 -}}
{{- $key := include "tiergate.redisAuthKey" . -}}
{{- with (lookup "v1" "Secret" .Release.Namespace (include "tiergate.redisAuthSecret" .)) -}}
{{- with (index (.data | default dict) $key) -}}
{{- $password = b64dec . -}}
{{- end -}}
{{- end -}}
{{- /* one value per render: every template that includes this sees the same password */ -}}
{{- $_ := set .Values "__tiergateRedisPassword" $password -}}
{{- end -}}
{{- index .Values "__tiergateRedisPassword" -}}
{{- end -}}

{{/* Pod annotation that rolls a pod when the chart-made Redis password changes. */}}
{{- define "tiergate.redisAuthChecksum" -}}
{{- if and .Values.redis.enabled (not .Values.redis.auth.existingSecret) }}
checksum/redis-auth: {{ include "tiergate.redisPassword" . | sha256sum }}
{{- end -}}
{{- end -}}

{{/* The Service name of one in-chart vLLM replica: (dict "root" $ "tier" "fast" "index" 0) */}}
{{- define "tiergate.vllmName" -}}
{{- printf "%s-vllm-%s-%d" (include "tiergate.fullname" .root) .tier (int .index) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels ---------------------------------------------------------------------------------- */}}

{{- define "tiergate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tiergate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tiergate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tiergate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tiergate
{{- end -}}

{{/* Pods of one component: (dict "root" $ "component" "gateway") */}}
{{- define "tiergate.componentSelector" -}}
{{ include "tiergate.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Derived settings -------------------------------------------------------------------------- */}}

{{/* "true" when a TLS terminator sits in front of the gateway. */}}
{{- define "tiergate.tlsInFront" -}}
{{- $server := .Values.config.server | default dict -}}
{{- if or $server.tls_terminated_upstream (and .Values.ingress.enabled (gt (len .Values.ingress.tls) 0)) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the gateway uses Redis (rate limits or the key store). */}}
{{- define "tiergate.usesRedis" -}}
{{- $rl := .Values.config.ratelimit | default dict -}}
{{- $auth := .Values.config.auth | default dict -}}
{{- if or (eq (toString $rl.backend) "redis") (eq (toString $auth.store) "redis") -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when any tier points at vLLM Services that this chart does not manage. */}}
{{- define "tiergate.usesExternalVllm" -}}
{{- range $name, $tier := .Values.config.tiers -}}
{{- $vllm := index $.Values.vllm.tiers $name | default dict -}}
{{- if not $vllm.enabled -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tiergate.hasAdminToken" -}}
{{- if .Values.auth.existingSecret -}}
{{- if .Values.auth.existingSecretKeys.adminToken -}}true{{- end -}}
{{- else if .Values.auth.adminToken -}}true{{- end -}}
{{- end -}}

{{- define "tiergate.hasKeys" -}}
{{- if .Values.auth.existingSecret -}}
{{- if .Values.auth.existingSecretKeys.keys -}}true{{- end -}}
{{- else if .Values.auth.keys -}}true{{- end -}}
{{- end -}}

{{/* The longest stream any tier allows (timeouts.total_s), in seconds. */}}
{{- define "tiergate.longestStream" -}}
{{- $longest := 0.0 -}}
{{- range $name, $tier := .Values.config.tiers -}}
{{- $timeouts := $tier.timeouts | default dict -}}
{{- $longest = maxf $longest (float64 (default 600 $timeouts.total_s)) -}}
{{- end -}}
{{- $longest -}}
{{- end -}}

{{/*
The gateway configuration file. Starts from .Values.config and fills in what the chart owns:
the listen port, secret file paths, in-chart vLLM replica URLs, Redis and the metrics port.
Secrets never enter it: keys and the admin token are files from the Secret, and an external
Redis URL (which may carry a password) arrives as an environment variable from the Secret.
*/}}
{{- define "tiergate.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $server := $cfg.server | default dict -}}
{{- $_ := set $server "port" (int .Values.service.port) -}}
{{- if include "tiergate.tlsInFront" . -}}
{{- $_ := set $server "tls_terminated_upstream" true -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- $auth := $cfg.auth | default dict -}}
{{- if include "tiergate.hasKeys" . -}}
{{- $_ := set $auth "keys_file" "/etc/tiergate/secrets/keys.yaml" -}}
{{- end -}}
{{- if include "tiergate.hasAdminToken" . -}}
{{- $_ := set $auth "admin_token_file" "/etc/tiergate/secrets/admin-token" -}}
{{- end -}}
{{- $_ := set $cfg "auth" $auth -}}
{{- $tiers := dict -}}
{{- range $name, $tier := $cfg.tiers -}}
{{- $vllm := index $.Values.vllm.tiers $name | default dict -}}
{{- if $vllm.enabled -}}
{{- $urls := list -}}
{{- range $i := until (int $vllm.replicaCount) -}}
{{- $svc := include "tiergate.vllmName" (dict "root" $ "tier" $name "index" $i) -}}
{{- $urls = append $urls (printf "http://%s.%s.svc:%d" $svc $.Release.Namespace (int $.Values.vllm.port)) -}}
{{- end -}}
{{- $_ := set $tier "replicas" $urls -}}
{{- end -}}
{{- $_ := set $tiers $name $tier -}}
{{- end -}}
{{- $_ := set $cfg "tiers" $tiers -}}
{{- if .Values.redis.enabled -}}
{{- $redis := dict "url" (printf "redis://%s-redis.%s.svc:6379/0" (include "tiergate.fullname" .) .Release.Namespace) "password_file" "/etc/tiergate/redis/password" -}}
{{- $_ := set $cfg "redis" (merge $redis ($cfg.redis | default dict)) -}}
{{- end -}}
{{- $telemetry := $cfg.telemetry | default dict -}}
{{- $_ := set $telemetry "metrics_port" (int .Values.service.metricsPort) -}}
{{- if .Values.otlp.endpoint -}}
{{- $_ := set $telemetry "tracing" true -}}
{{- end -}}
{{- $_ := set $cfg "telemetry" $telemetry -}}
{{- toYaml $cfg -}}
{{- end -}}
