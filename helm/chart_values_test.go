package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// checkGovernanceSecrets: the runner's tokens for governed agent types
// come from its Secret, under the keys runner.secret names.
func checkGovernanceSecrets(t *testing.T, r rendered) {
	t.Helper()
	want := map[string]string{"CONCLAVE_RUNNER_LIBRARIAN_TOKENS": "librarian-tokens", "CONCLAVE_RUNNER_BUS_TOKEN": "bus-token"}
	for _, e := range r.deployments[release+"-runner"].Spec.Template.Spec.Containers[0].Env {
		if key, ok := want[e.Name]; ok {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != key {
				t.Errorf("%s is %+v, want the runner Secret's key %s", e.Name, e.ValueFrom, key)
			}
			delete(want, e.Name)
		}
	}
	for name := range want {
		t.Errorf("the runner has no %s", name)
	}
}

func checkDev(t *testing.T, r rendered) {
	t.Helper()
	jaeger, ok := r.deployments[release+"-jaeger"]
	if !ok {
		t.Fatal("values-dev.yaml renders no Jaeger")
	}
	if img := jaeger.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "jaegertracing/all-in-one:") {
		t.Errorf("Jaeger image %s", img)
	}
	if _, ok := r.services[release+"-jaeger"]; !ok {
		t.Error("no Jaeger Service")
	}
	for _, d := range deployables {
		dep := r.deployments[release+"-"+d]
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
			t.Errorf("%s: replicas %v, want 1", d, dep.Spec.Replicas)
		}
		env := envOf(dep)
		if want := "embedded"; slices.Contains(storeDeployables, d) && env["CONCLAVE_BACKEND"] != want {
			t.Errorf("%s: CONCLAVE_BACKEND=%q, want %s", d, env["CONCLAVE_BACKEND"], want)
		}
		if want := release + "-jaeger:4317"; env["OTEL_EXPORTER_OTLP_ENDPOINT"] != want {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT=%q, want %q", d, env["OTEL_EXPORTER_OTLP_ENDPOINT"], want)
		}
	}
	// Every service requires its tokens, from the Secret the chart makes
	// (a pod listens beyond loopback, where none starts without them);
	// people sign in to the console with its dev-token.
	checkDevSecret(t, r, devAgentID)
	for _, d := range deployables {
		for name, value := range envOf(r.deployments[release+"-"+d]) {
			if strings.Contains(name, "_ALLOW_") {
				t.Errorf("%s: %s=%q: the dev values run without a token", d, name, value)
			}
		}
	}
	// The console links trace ids to the port-forwarded Jaeger.
	console := r.deployments[release+"-console"]
	env := envOf(console)
	if want := "http://127.0.0.1:16686"; env["CONCLAVE_CONSOLE_JAEGER_URL"] != want {
		t.Errorf("CONCLAVE_CONSOLE_JAEGER_URL=%q, want %s (the NOTES' port-forward)", env["CONCLAVE_CONSOLE_JAEGER_URL"], want)
	}
	// The console reads traces from the dev Jaeger's Service, not from the
	// browser's port-forward, which means nothing in its pod.
	if want := "http://" + release + "-jaeger.conclave.svc:16686"; env["CONCLAVE_CONSOLE_JAEGER_QUERY_URL"] != want {
		t.Errorf("CONCLAVE_CONSOLE_JAEGER_QUERY_URL=%q, want %s", env["CONCLAVE_CONSOLE_JAEGER_QUERY_URL"], want)
	}
}

func checkAWS(t *testing.T, r rendered) {
	t.Helper()
	if want := "https://abcdef1234.execute-api.us-east-1.amazonaws.com"; envOf(r.deployments[release+"-console"])["CONCLAVE_CONSOLE_LIBRARIAN_URL"] != want {
		t.Errorf("the console's Librarian URL is not values-aws.yaml's %s", want)
	}
	for _, d := range storeDeployables {
		dep := r.deployments[release+"-"+d]
		if env := envOf(dep); env["CONCLAVE_BACKEND"] != "aws" {
			t.Errorf("%s: CONCLAVE_BACKEND=%q, want aws", d, env["CONCLAVE_BACKEND"])
		}
		sa := r.serviceAccounts[dep.Spec.Template.Spec.ServiceAccountName]
		// infra/template.yaml trusts system:serviceaccount:conclave:conclave-<name>.
		if sa == nil || sa.Name != "conclave-"+d {
			t.Errorf("%s: ServiceAccount %v, want conclave-%s (infra/'s default)", d, sa, d)
			continue
		}
		if arn := sa.Annotations["eks.amazonaws.com/role-arn"]; !strings.HasPrefix(arn, "arn:aws:iam::") {
			t.Errorf("ServiceAccount %s: IRSA annotation %q", sa.Name, arn)
		}
	}
}

// schema is the part of values.schema.json the tests read.
type schema struct {
	Type       string             `json:"type"`
	Enum       []any              `json:"enum"`
	Pattern    string             `json:"pattern"`
	Properties map[string]*schema `json:"properties"`
}

// allSettingsValues writes a values file that sets every setting
// values.schema.json allows each deployable (a sample of its type), turns
// on every optional part, and returns its path. Rendering it proves each
// allowed setting becomes an env var the code reads.
func allSettingsValues(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	values := map[string]any{
		"jaeger": map[string]any{"enabled": true},
		"aws":    map[string]any{"endpoint": "http://dynalite.conclave.svc:4567", "credentialsSecret": "local-aws"},
		"observability": map[string]any{
			"dashboards":     map[string]any{"enabled": true},
			"rules":          map[string]any{"enabled": true},
			"prometheusRule": map[string]any{"enabled": true},
		},
	}
	for _, d := range deployables {
		settings := map[string]any{}
		for key, prop := range s.Properties[d].Properties["settings"].Properties {
			switch {
			case len(prop.Enum) > 0:
				settings[key] = prop.Enum[0]
			case prop.Type == "boolean":
				settings[key] = false
			case prop.Type == "integer":
				settings[key] = 7
			case prop.Type == "number":
				settings[key] = 2.5
			case prop.Pattern != "" && strings.Contains(prop.Pattern, "ms|s|m|h"):
				settings[key] = "1m30s"
			case strings.HasPrefix(prop.Pattern, "^(https?://"):
				settings[key] = "https://agents.example.com"
			default:
				settings[key] = "sample"
			}
		}
		if len(settings) == 0 {
			t.Fatalf("the schema allows no settings for %s", d)
		}
		values[d] = map[string]any{
			"settings":    settings,
			"autoscaling": map[string]any{"enabled": true},
		}
	}
	section := func(name string) map[string]any {
		s, ok := values[name].(map[string]any)
		if !ok {
			t.Fatalf("values.%s is %T, not a section to set", name, values[name])
		}
		return s
	}
	runner, bus, console, gateway := section("runner"), section("bus"), section("console"), section("gateway")
	runner["agentTypes"] = allSettingsAgentTypes
	// Every part of the Kubernetes executor's block, in the release's
	// namespace (TestKubernetesExecutor renders another).
	runner["executor"] = "kubernetes"
	runner["kubernetes"] = map[string]any{
		"hostImage": "registry.example.com/agent-host:1", "imagePullPolicy": "Always",
		"serviceAccount": map[string]any{"create": true, "name": "agents", "annotations": map[string]any{"example.com/role": "agents"}}, "runAsNonRoot": true, "workspaceClaim": "workspaces",
		"workspaceRoot": "/claims", "workspaceMount": "/src", "ttlAfterFinished": "1h",
		"startGrace": "30s", "secretEnv": []string{"*_SECRET"},
		"networkPolicy": map[string]any{"egress": []any{map[string]any{"ports": []any{map[string]any{"port": 443, "protocol": "TCP"}}}}},
	}
	// Governed agent types' tokens (docs/governance.md).
	runner["secret"] = map[string]any{"librarianTokensKey": "librarian-tokens", "busTokenKey": "bus-token"}
	bus["runnerAgentType"] = "my-agent"
	bus["runnerAddr"] = allSettingsRunnerAddr
	bus["publicUrl"] = allSettingsBusURL
	console["secret"] = map[string]any{"eventsBusTokenKey": "events-bus-token"}
	gateway["secret"] = map[string]any{"adminTokensKey": "admin-tokens"}
	console["urls"] = map[string]any{
		"librarian": "https://librarian.example.com", "jaeger": "https://jaeger.example.com",
	}
	out, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "all-settings.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// allSettingsAgentTypes is all-settings' runner.agentTypes.
const allSettingsAgentTypes = "agent_types:\n  - id: my-agent\n    image: example.com/my-agent:1\n    command: [my-agent, --acp]\n"

// The bus's addresses in all-settings: the forms a cluster without DNS
// for Services uses (deploy/kubetest, e2e's Kubernetes shape).
const (
	allSettingsRunnerAddr = "$(CONCLAVE_RUNNER_SERVICE_HOST):$(CONCLAVE_RUNNER_SERVICE_PORT_GRPC)"
	allSettingsBusURL     = "ws://$(CONCLAVE_BUS_SERVICE_HOST):$(CONCLAVE_BUS_SERVICE_PORT_HTTP)"
)

// checkBusAddresses checks where the bus's default handler reaches the
// runner, and the URL its launched agents get: the values given, or by
// default the Services' DNS names.
func checkBusAddresses(t *testing.T, r rendered, runnerAddr, publicURL string) {
	t.Helper()
	env := envOf(r.deployments[release+"-bus"])
	if got := env["CONCLAVE_BUS_PUBLIC_URL"]; got != publicURL {
		t.Errorf("CONCLAVE_BUS_PUBLIC_URL = %q, want %q", got, publicURL)
	}
	// Rendered only with a runnerAgentType.
	if got, ok := env["CONCLAVE_BUS_RUNNER_ADDR"]; ok && got != runnerAddr {
		t.Errorf("CONCLAVE_BUS_RUNNER_ADDR = %q, want %q", got, runnerAddr)
	}
}

// TestSchemaRejects checks values.schema.json (and the chart's own fail
// calls) turn bad values away with a message naming the value.
func TestSchemaRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		set  []string
		want string
	}{
		{"backend not aws or embedded", []string{"backend=dynamo"}, "at '/backend': value must be one of 'aws', 'embedded'"},
		{"zero replicas", []string{"gateway.replicaCount=0"}, "at '/gateway/replicaCount': minimum: got 0, want 1"},
		{"too many replicas", []string{"bus.replicaCount=500"}, "at '/bus/replicaCount': maximum: got 500, want 100"},
		{"replicas not a number", []string{"runner.replicaCount=two"}, "at '/runner/replicaCount': got string, want integer"},
		{"embedded storage with replicas", []string{"backend=embedded", "gateway.replicaCount=2"}, "at '/gateway/replicaCount': maximum: got 2, want 1"},
		{"unknown setting", []string{"gateway.settings.agentTimeot=5s"}, "additional properties 'agentTimeot' not allowed"},
		{"a gateway public URL with a path", []string{"gateway.settings.publicUrl=https://agents.example.com/a2a"}, "publicUrl"},
		{"bad duration", []string{"runner.settings.idleTimeout=ten minutes"}, "at '/runner/settings/idleTimeout': 'ten minutes' does not match pattern"},
		{"bad bus policy", []string{"bus.settings.policy=firstWins"}, "at '/bus/settings/policy': value must be one of"},
		{"no token secret", []string{"gateway.secret.name="}, "at '/gateway/secret/name': minLength: got 0, want 1"},
		{"bad log level", []string{"log.level=verbose"}, "at '/log/level': value must be one of 'debug', 'info', 'warn', 'error'"},
		{"missing image repository", []string{"bus.image.repository=null"}, "at '/bus/image': missing property 'repository'"},
		{"bad service type", []string{"gateway.service.type=Ingress"}, "at '/gateway/service/type': value must be one of"},
		{"port out of range", []string{"runner.service.grpcPort=70000"}, "at '/runner/service/grpcPort': maximum: got 70,000, want 65,535"},
		{"bad queue name", []string{"runner.launchQueue=runner launches"}, "at '/runner/launchQueue'"},
		{"unknown top-level key", []string{"gatway.enabled=false"}, "additional properties 'gatway' not allowed"},
		{"bad AWS credentials Secret name", []string{"aws.credentialsSecret=AWS_Creds"}, "at '/aws/credentialsSecret': 'AWS_Creds' does not match pattern"},
		{"executor not local or kubernetes", []string{"runner.executor=docker"}, "at '/runner/executor': value must be one of 'local', 'kubernetes'"},
		{"bad agent pull policy", []string{"runner.executor=kubernetes", "runner.kubernetes.imagePullPolicy=Sometimes"}, "at '/runner/kubernetes/imagePullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"},
		{"agent ttl not a duration", []string{"runner.kubernetes.ttlAfterFinished=600"}, "at '/runner/kubernetes/ttlAfterFinished': got number, want string"},
		{"bad agent start grace", []string{"runner.kubernetes.startGrace=two minutes"}, "at '/runner/kubernetes/startGrace': 'two minutes' does not match pattern"},
		{"bad agents' namespace", []string{"runner.kubernetes.namespace=Agents"}, "at '/runner/kubernetes/namespace': 'Agents' does not match pattern"},
		{"unknown kubernetes key", []string{"runner.kubernetes.hostImg=x"}, "additional properties 'hostImg' not allowed"},
		{"kubernetes executor without a host key", []string{"runner.executor=kubernetes", "runner.secret.hostKeyKey="}, "at '/runner/secret/hostKeyKey': minLength: got 0, want 1"},
		{"default executor without a host key", []string{"runner.secret.hostKeyKey="}, "at '/runner/secret/hostKeyKey': minLength: got 0, want 1"},
		{"agents' ServiceAccount as a name only", []string{"runner.kubernetes.serviceAccount=agent"}, "at '/runner/kubernetes/serviceAccount': got string, want object"},
		{"bad agents' ServiceAccount name", []string{"runner.kubernetes.serviceAccount.name=Agents"}, "at '/runner/kubernetes/serviceAccount/name': 'Agents' does not match pattern"},
		{"example agent without a repository", []string{"exampleAgent.image.repository="}, "at '/exampleAgent/image/repository': minLength: got 0, want 1"},
		{"kubernetes executor without the runner's Secret", []string{"runner.executor=kubernetes", "runner.secret.name="}, "at '/runner/secret/name': minLength: got 0, want 1"},
		{"local executor without the runner's Secret", []string{"runner.executor=local", "runner.secret.name="}, "at '/runner/secret/name': minLength: got 0, want 1"},
		{"no bus Secret", []string{"bus.secret.name="}, "at '/bus/secret/name': minLength: got 0, want 1"},
		{"gateway without authentication", []string{"gateway.settings.allowUnauthenticated=true"}, "gateway.settings.allowUnauthenticated: a pod listens on its own address, and a service without authentication listens on loopback only"},
		{"gateway's agents without tokens", []string{"gateway.settings.allowAgentsWithoutTokens=true"}, "gateway.settings.allowAgentsWithoutTokens: a pod listens on its own address"},
		{"bus without authentication", []string{"bus.settings.allowUnauthenticated=true"}, "bus.settings.allowUnauthenticated: a pod listens on its own address"},
		{"runner without authentication", []string{"runner.settings.allowUnauthenticated=true"}, "runner.settings.allowUnauthenticated: a pod listens on its own address"},
		{"console without sign-in", []string{"console.settings.allowUnauthenticated=true"}, "console.settings.allowUnauthenticated: a pod listens on its own address"},
		{"open console with generated Secrets", []string{"devSecrets.generate=true", "console.settings.allowUnauthenticated=true"}, "console.settings.allowUnauthenticated: a pod listens on its own address"},
		{"dev agent id with a comma", []string{"devSecrets.agentId=a\\,b"}, "at '/devSecrets/agentId': 'a,b' does not match pattern"},
		{"dev agent id empty", []string{"devSecrets.generate=true", "devSecrets.agentId="}, "at '/devSecrets/agentId': '' does not match pattern"},
		{"devSecrets.generate not a boolean", []string{"devSecrets.generate=yes"}, "at '/devSecrets/generate': got string, want boolean"},
		{"unknown devSecrets key", []string{"devSecrets.generated=true"}, "additional properties 'generated' not allowed"},
		{"console without its Secret", []string{"console.secret.name="}, "at '/console/secret/name': minLength: got 0, want 1"},
		{"console without a session key", []string{"console.secret.sessionKeyKey="}, "at '/console/secret/sessionKeyKey': minLength: got 0, want 1"},
		{"console's session key as a value", []string{"console.settings.sessionKey=c2VjcmV0"}, "at '/console/settings': additional properties 'sessionKey' not allowed"},
		{"console's gateway URL without a scheme", []string{"console.urls.gateway=conclave-gateway:8080"}, "at '/console/urls/gateway': 'conclave-gateway:8080' does not match pattern"},
		{"console's bus URL not a WebSocket one", []string{"console.urls.bus=http://conclave-bus:7892"}, "at '/console/urls/bus': 'http://conclave-bus:7892' does not match pattern"},
		{"console's session affinity", []string{"console.service.sessionAffinity=Cookie"}, "at '/console/service/sessionAffinity': value must be one of 'None', 'ClientIP'"},
		{"preStop sleep as long as the grace period", []string{"console.preStopSleepSeconds=30"}, "console: preStopSleepSeconds (30) must be below terminationGracePeriodSeconds (30)"},
		{"negative preStop sleep", []string{"gateway.preStopSleepSeconds=-1"}, "at '/gateway/preStopSleepSeconds': minimum: got -1, want 0"},
		{"bus URL not a WebSocket one", []string{"bus.publicUrl=http://bus.example.com"}, "at '/bus/publicUrl': 'http://bus.example.com' does not match pattern"},
		{"runner address without a port", []string{"bus.runnerAddr=conclave-runner"}, "at '/bus/runnerAddr': 'conclave-runner' does not match pattern"},
		{"autoscaling bounds inverted", []string{"bus.autoscaling.enabled=true", "bus.autoscaling.minReplicas=5", "bus.autoscaling.maxReplicas=3"}, "bus.autoscaling: minReplicas (5) is above maxReplicas (3)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"template", release, chartDir, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm template accepted %v:\n%.500s", tc.set, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template rejected %v, but its message lacks %q:\n%v", tc.set, tc.want, err)
			}
		})
	}
}

// observabilityDir is the module whose dashboards and rules the chart ships
// (helm/conclave/files links to it).
const observabilityDir = "../deploy/observability"

// checkObservability checks the chart ships every dashboard and the alert
// rules of deploy/observability unchanged.
func checkObservability(t *testing.T, r rendered) {
	t.Helper()
	dashboards, err := filepath.Glob(filepath.Join(observabilityDir, "dashboards", "*.json"))
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboards in %s (%v)", observabilityDir, err)
	}
	for _, path := range dashboards {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		cm, ok := r.configMaps[release+"-dashboard-"+name]
		if !ok {
			t.Errorf("no ConfigMap for dashboard %s", name)
			continue
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard %s's ConfigMap lacks Grafana's sidecar label", name)
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := cm.Data["conclave-"+name+".json"]; got != strings.TrimRight(string(want), "\n") {
			t.Errorf("dashboard %s's ConfigMap differs from %s", name, path)
		}
	}
	want, err := os.ReadFile(filepath.Join(observabilityDir, "rules", "conclave.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.configMaps[release+"-alert-rules"].Data["conclave.rules.yaml"]; got != strings.TrimRight(string(want), "\n") {
		t.Errorf("the alert rules ConfigMap differs from deploy/observability/rules/conclave.rules.yaml")
	}
}

// checkPrometheusRule checks a rendered PrometheusRule's spec is the rules
// file of deploy/observability.
func checkPrometheusRule(t *testing.T, obj map[string]any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(observabilityDir, "rules", "conclave.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(obj["spec"], want) {
		t.Errorf("the PrometheusRule's spec differs from deploy/observability/rules/conclave.rules.yaml")
	}
}
