{{/* The deployables this chart runs, in a fixed order. */}}
{{- define "conclave.deployables" -}}
{{- list "gateway" "bus" "runner" "console" | toJson -}}
{{- end -}}

{{/*
conclave.hasStore: "true" for the deployables with state of their own in
DynamoDB and SQS (or the embedded store); the console has none.
*/}}
{{- define "conclave.hasStore" -}}
{{- has . (list "gateway" "bus" "runner") -}}
{{- end -}}

{{- define "conclave.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* conclave.name: <fullname>-<component>; takes (dict "root" $ "name" "gateway"). */}}
{{- define "conclave.name" -}}
{{- printf "%s-%s" (include "conclave.fullname" .root) .name -}}
{{- end -}}

{{- define "conclave.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "conclave.selectorLabels" . }}
{{- end -}}

{{- define "conclave.selectorLabels" -}}
app.kubernetes.io/name: conclave
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "conclave.serviceAccountName" -}}
{{- $c := index .root.Values .name -}}
{{- if $c.serviceAccount.name -}}
{{- $c.serviceAccount.name -}}
{{- else -}}
{{- include "conclave.name" . -}}
{{- end -}}
{{- end -}}

{{- define "conclave.image" -}}
{{- $c := index .root.Values .name -}}
{{- $tag := $c.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) $c.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $c.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
conclave.ports: the listeners of a deployable as a JSON list of
{name, port, appProtocol}. "http" always serves /healthz, /readyz and
/metrics.
*/}}
{{- define "conclave.ports" -}}
{{- $c := index .root.Values .name -}}
{{- if has .name (list "bus" "console") -}}
{{- list (dict "name" "http" "port" $c.service.port "appProtocol" "http") | toJson -}}
{{- else -}}
{{- list (dict "name" "grpc" "port" $c.service.grpcPort "appProtocol" "kubernetes.io/h2c") (dict "name" "http" "port" $c.service.httpPort "appProtocol" "http") | toJson -}}
{{- end -}}
{{- end -}}

{{/*
conclave.runnerWorkspaceRoot: where the runner's workspace volume is
mounted: the Kubernetes executor's claim's root when it has a claim, else
runner.workspaceRoot.
*/}}
{{- define "conclave.runnerWorkspaceRoot" -}}
{{- $r := .Values.runner -}}
{{- if and (eq $r.executor "kubernetes") $r.kubernetes.workspaceClaim -}}
{{- $r.kubernetes.workspaceRoot | default $r.workspaceRoot -}}
{{- else -}}
{{- $r.workspaceRoot -}}
{{- end -}}
{{- end -}}

{{/* conclave.agentNamespace: the namespace of the Kubernetes executor's Jobs. */}}
{{- define "conclave.agentNamespace" -}}
{{- .Values.runner.kubernetes.namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
conclave.agentServiceAccount: the ServiceAccount of the Kubernetes
executor's agent pods: runner.kubernetes.serviceAccount.name, or with
create <release>-agents; empty (the namespace's default) otherwise.
*/}}
{{- define "conclave.agentServiceAccount" -}}
{{- $sa := .Values.runner.kubernetes.serviceAccount -}}
{{- if $sa.name -}}
{{- $sa.name -}}
{{- else if $sa.create -}}
{{- include "conclave.name" (dict "root" . "name" "agents") -}}
{{- end -}}
{{- end -}}

{{/*
conclave.agentTypes: the runner's agent types file: runner.agentTypes, or
with the Kubernetes executor and none given, the example ACP agent's type
(examples/acp-agent: it streams a reply and asks to write notes.txt in its
workspace; the runner's default permission, deny, refuses) in
exampleAgent.image, so that a fresh install can launch an agent. Empty:
no file, the runner's defaults only.
*/}}
{{- define "conclave.agentTypes" -}}
{{- $r := .Values.runner -}}
{{- if $r.agentTypes -}}
{{- $r.agentTypes -}}
{{- else if eq $r.executor "kubernetes" -}}
agent_types:
  - id: acp-agent
    name: Example ACP agent
    description: Conclave's example ACP agent (examples/acp-agent)
    image: {{ include "conclave.image" (dict "root" . "name" "exampleAgent") }}
    command: [/usr/local/bin/acp-agent]
    protocol: acp
    memory_mb: 128
    cpu_cores: 0.25
    timeout: 10m
    enabled: true
{{- end -}}
{{- end -}}

{{/*
conclave.agentSelectorLabels: the labels the runner's Kubernetes executor
puts on every agent pod (services/runner/internal/executor/kube_spec.go:
LabelManagedBy, ManagedByRunner).
*/}}
{{- define "conclave.agentSelectorLabels" -}}
app.kubernetes.io/managed-by: conclave-runner
{{- end -}}

{{- define "conclave.otlpEndpoint" -}}
{{- if .Values.otlp.endpoint -}}
{{- .Values.otlp.endpoint -}}
{{- else if .Values.jaeger.enabled -}}
{{- printf "%s-jaeger:4317" (include "conclave.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
conclave.consoleURL: the URL the console calls a service at: console.urls
.<service>, else this release's Service of it (by the name cluster DNS
resolves) when it is enabled here, else nothing. Takes (dict "root" $
"name" "gateway"|"bus"|"runner").
*/}}
{{- define "conclave.consoleURL" -}}
{{- $root := .root -}}
{{- $c := index $root.Values .name -}}
{{- $host := printf "%s.%s.svc" (include "conclave.name" .) $root.Release.Namespace -}}
{{- $url := index $root.Values.console.urls .name -}}
{{- if $url -}}
{{- $url -}}
{{- else if $c.enabled -}}
{{- if eq .name "bus" -}}
{{- printf "ws://%s:%v" $host $c.service.port -}}
{{- else -}}
{{- printf "http://%s:%v" $host $c.service.httpPort -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* conclave.devSecretName: the Secret devSecrets.generate makes. */}}
{{- define "conclave.devSecretName" -}}
{{- printf "%s-dev-secrets" (include "conclave.fullname" .) -}}
{{- end -}}

{{/*
conclave.secret: the Secret a deployable reads its secret settings from,
as its values' secret block ({name, <setting>Key...}): that block, or with
devSecrets.generate the generated Secret and its keys
(templates/dev-secrets.yaml). Takes the root and the deployable's name
(dict "root" $ "name" "gateway"); returns JSON.
*/}}
{{- define "conclave.secret" -}}
{{- if .root.Values.devSecrets.generate -}}
{{- $keys := dict
  "gateway" (dict "clientTokensKey" "gateway-client-tokens" "agentTokensKey" "gateway-agent-tokens")
  "bus" (dict "grantsKey" "bus-grants" "peerTokenKey" "bus-peer-token" "runnerTokenKey" "bus-runner-token")
  "runner" (dict "clientTokensKey" "runner-client-tokens" "hostKeyKey" "runner-host-key" "gatewayTokenKey" "runner-gateway-token")
  "console" (dict "sessionKeyKey" "console-session-key" "eventsBusTokenKey" "console-events-bus-token") -}}
{{- set (index $keys .name) "name" (include "conclave.devSecretName" .root) | toJson -}}
{{- else -}}
{{- (index .root.Values .name).secret | toJson -}}
{{- end -}}
{{- end -}}

{{/* conclave.secretEnv: one env var from the deployable's Secret; takes (dict "env" NAME "secret" NAME "key" KEY). */}}
{{- define "conclave.secretEnv" -}}
{{- if and .secret .key }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end }}
{{- end -}}

{{/* conclave.env: every env var of a deployable's container. */}}
{{- define "conclave.env" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $c := index $root.Values $name -}}
{{- $prefix := printf "CONCLAVE_%s_" (upper $name) -}}
{{- $secret := include "conclave.secret" . | fromJson -}}
{{- if eq (include "conclave.hasStore" $name) "true" }}
# POD_IP is no Conclave setting: the advertise address below expands it.
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: CONCLAVE_BACKEND
  value: {{ $root.Values.backend | quote }}
- name: CONCLAVE_TABLE_PREFIX
  value: {{ $root.Values.tablePrefix | quote }}
- name: AWS_REGION
  value: {{ $root.Values.aws.region | quote }}
{{- if $root.Values.aws.endpoint }}
- name: CONCLAVE_AWS_ENDPOINT
  value: {{ $root.Values.aws.endpoint | quote }}
{{- end }}
{{- with $root.Values.aws.credentialsSecret }}
{{- include "conclave.secretEnv" (dict "env" "AWS_ACCESS_KEY_ID" "secret" . "key" "AWS_ACCESS_KEY_ID") }}
{{- include "conclave.secretEnv" (dict "env" "AWS_SECRET_ACCESS_KEY" "secret" . "key" "AWS_SECRET_ACCESS_KEY") }}
{{- end }}
{{- if eq $root.Values.backend "embedded" }}
- name: CONCLAVE_DATA_DIR
  value: /var/lib/conclave
{{- end }}
{{- end }}
- name: CONCLAVE_LOG_LEVEL
  value: {{ $root.Values.log.level | quote }}
- name: CONCLAVE_LOG_FORMAT
  value: {{ $root.Values.log.format | quote }}
{{- with include "conclave.otlpEndpoint" $root }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_EXPORTER_OTLP_INSECURE
  value: {{ $root.Values.otlp.insecure | quote }}
{{- end }}
{{- if eq $name "gateway" }}
- name: CONCLAVE_GATEWAY_GRPC_ADDR
  value: {{ printf ":%v" $c.service.grpcPort | quote }}
- name: CONCLAVE_GATEWAY_HTTP_ADDR
  value: {{ printf ":%v" $c.service.httpPort | quote }}
- name: CONCLAVE_GATEWAY_ADVERTISE_ADDR
  value: {{ printf "$(POD_IP):%v" $c.service.grpcPort | quote }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_GATEWAY_CLIENT_TOKENS" "secret" $secret.name "key" $secret.clientTokensKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_GATEWAY_AGENT_TOKENS" "secret" $secret.name "key" $secret.agentTokensKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_GATEWAY_ADMIN_TOKENS" "secret" $secret.name "key" $secret.adminTokensKey) }}
{{- else if eq $name "bus" }}
- name: CONCLAVE_BUS_ADDR
  value: {{ printf ":%v" $c.service.port | quote }}
- name: CONCLAVE_BUS_ADVERTISE_ADDR
  value: {{ printf "$(POD_IP):%v" $c.service.port | quote }}
- name: CONCLAVE_BUS_PUBLIC_URL
  value: {{ $c.publicUrl | default (printf "ws://%s.%s.svc:%v" (include "conclave.name" .) $root.Release.Namespace $c.service.port) | quote }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_BUS_GRANTS" "secret" $secret.name "key" $secret.grantsKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_BUS_PEER_TOKEN" "secret" $secret.name "key" $secret.peerTokenKey) }}
{{- if and $c.runnerAgentType $root.Values.runner.enabled }}
- name: CONCLAVE_BUS_RUNNER_ADDR
  value: {{ $c.runnerAddr | default (printf "%s:%v" (include "conclave.name" (dict "root" $root "name" "runner")) $root.Values.runner.service.grpcPort) | quote }}
- name: CONCLAVE_BUS_RUNNER_AGENT_TYPE
  value: {{ $c.runnerAgentType | quote }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_BUS_RUNNER_TOKEN" "secret" $secret.name "key" $secret.runnerTokenKey) }}
{{- end }}
{{- else if eq $name "runner" }}
- name: CONCLAVE_RUNNER_GRPC_ADDR
  value: {{ printf ":%v" $c.service.grpcPort | quote }}
- name: CONCLAVE_RUNNER_HTTP_ADDR
  value: {{ printf ":%v" $c.service.httpPort | quote }}
- name: CONCLAVE_RUNNER_ADVERTISE_ADDR
  value: {{ printf "$(POD_IP):%v" $c.service.grpcPort | quote }}
- name: CONCLAVE_RUNNER_LAUNCH_QUEUE
  value: {{ $c.launchQueue | quote }}
- name: CONCLAVE_RUNNER_EVENTS_QUEUE
  value: {{ $c.eventsQueue | quote }}
- name: CONCLAVE_RUNNER_WORKSPACE_ROOTS
  value: {{ include "conclave.runnerWorkspaceRoot" $root | quote }}
{{- if include "conclave.agentTypes" $root }}
- name: CONCLAVE_RUNNER_AGENT_TYPES
  value: /etc/conclave/agent-types.yaml
{{- end }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_RUNNER_CLIENT_TOKENS" "secret" $secret.name "key" $secret.clientTokensKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_RUNNER_LIBRARIAN_TOKENS" "secret" $secret.name "key" $secret.librarianTokensKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_RUNNER_BUS_TOKEN" "secret" $secret.name "key" $secret.busTokenKey) }}
{{- if and $c.gatewayAgents.enabled (or $c.gatewayAgents.addr $root.Values.gateway.enabled) }}
- name: CONCLAVE_RUNNER_GATEWAY_ADDR
  value: {{ $c.gatewayAgents.addr | default (printf "%s:%v" (include "conclave.name" (dict "root" $root "name" "gateway")) $root.Values.gateway.service.grpcPort) | quote }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_RUNNER_GATEWAY_TOKEN" "secret" $secret.name "key" $secret.gatewayTokenKey) }}
{{- if eq $c.executor "kubernetes" }}
# agent-host registers each Job's agent at the gateway, from its pod.
- name: CONCLAVE_RUNNER_HOST_GATEWAY_ADDR
  value: {{ $c.gatewayAgents.hostAddr | default $c.gatewayAgents.addr | default (printf "%s.%s.svc:%v" (include "conclave.name" (dict "root" $root "name" "gateway")) $root.Release.Namespace $root.Values.gateway.service.grpcPort) | quote }}
{{- $ts := $c.gatewayAgents.tokenSecret }}
{{- if $ts.name }}
- name: CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET
  value: {{ $ts.name | quote }}
- name: CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_KEY
  value: {{ $ts.key | default "gateway-token" | quote }}
{{- else if and $secret.gatewayTokenKey (eq (include "conclave.agentNamespace" $root) $root.Release.Namespace) }}
- name: CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET
  value: {{ $secret.name | quote }}
- name: CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_KEY
  value: {{ $secret.gatewayTokenKey | quote }}
{{- end }}
{{- end }}
{{- end }}
- name: CONCLAVE_RUNNER_EXECUTOR
  value: {{ $c.executor | quote }}
{{- if eq $c.executor "kubernetes" }}
{{- $k := $c.kubernetes }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_RUNNER_HOST_KEY" "secret" $secret.name "key" $secret.hostKeyKey) }}
# Agents' pods dial the replica that launched them, by its pod IP: only it
# expects their link.
- name: CONCLAVE_RUNNER_HOST_ADDR
  value: {{ printf "$(POD_IP):%v" $c.service.grpcPort | quote }}
- name: CONCLAVE_RUNNER_KUBE_NAMESPACE
  value: {{ include "conclave.agentNamespace" $root | quote }}
- name: CONCLAVE_RUNNER_KUBE_HOST_IMAGE
  value: {{ $k.hostImage | default (include "conclave.image" (dict "root" $root "name" "agentHost")) | quote }}
- name: CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY
  value: {{ $k.imagePullPolicy | quote }}
{{- with include "conclave.agentServiceAccount" $root }}
- name: CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT
  value: {{ . | quote }}
{{- end }}
- name: CONCLAVE_RUNNER_KUBE_RUN_AS_NON_ROOT
  value: {{ $k.runAsNonRoot | quote }}
{{- if $k.workspaceClaim }}
- name: CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM
  value: {{ $k.workspaceClaim | quote }}
- name: CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT
  value: {{ include "conclave.runnerWorkspaceRoot" $root | quote }}
{{- end }}
- name: CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT
  value: {{ $k.workspaceMount | quote }}
- name: CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED
  value: {{ $k.ttlAfterFinished | quote }}
- name: CONCLAVE_RUNNER_KUBE_START_GRACE
  value: {{ $k.startGrace | quote }}
- name: CONCLAVE_RUNNER_KUBE_SECRET_ENV
  value: {{ join "," $k.secretEnv | quote }}
{{- if and $root.Values.jaeger.enabled (not $root.Values.otlp.endpoint) (not (hasKey $c.settings "hostOtlpEndpoint")) }}
# agent-host's spans go to the dev Jaeger too, by a name the agents'
# namespace resolves.
- name: CONCLAVE_RUNNER_HOST_OTLP_ENDPOINT
  value: {{ printf "%s-jaeger.%s.svc:4317" (include "conclave.fullname" $root) $root.Release.Namespace | quote }}
{{- end }}
{{- end }}
{{- else if eq $name "console" }}
- name: CONCLAVE_CONSOLE_HTTP_ADDR
  value: {{ printf ":%v" $c.service.port | quote }}
# Each service's URL, set even when empty: the console's defaults are
# loopback addresses, which mean nothing in a pod.
- name: CONCLAVE_CONSOLE_GATEWAY_URL
  value: {{ include "conclave.consoleURL" (dict "root" $root "name" "gateway") | quote }}
- name: CONCLAVE_CONSOLE_BUS_URL
  value: {{ include "conclave.consoleURL" (dict "root" $root "name" "bus") | quote }}
- name: CONCLAVE_CONSOLE_RUNNER_URL
  value: {{ include "conclave.consoleURL" (dict "root" $root "name" "runner") | quote }}
- name: CONCLAVE_CONSOLE_LIBRARIAN_URL
  value: {{ $c.urls.librarian | quote }}
{{- with $c.urls.jaeger | default (ternary "http://127.0.0.1:16686" "" $root.Values.jaeger.enabled) }}
- name: CONCLAVE_CONSOLE_JAEGER_URL
  value: {{ . | quote }}
{{- end }}
{{- with $c.urls.jaegerQuery | default (ternary (printf "http://%s-jaeger.%s.svc:16686" (include "conclave.fullname" $root) $root.Release.Namespace) "" $root.Values.jaeger.enabled) }}
- name: CONCLAVE_CONSOLE_JAEGER_QUERY_URL
  value: {{ . | quote }}
{{- end }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_CONSOLE_SESSION_KEY" "secret" $secret.name "key" $secret.sessionKeyKey) }}
{{- include "conclave.secretEnv" (dict "env" "CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN" "secret" $secret.name "key" $secret.eventsBusTokenKey) }}
{{- end }}
{{- range $key, $value := $c.settings }}
- name: {{ printf "%s%s" $prefix ($key | snakecase | upper) }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}
