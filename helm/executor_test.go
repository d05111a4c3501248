package helm

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// agentPodLabels are labels the runner's Kubernetes executor puts on an
// agent's pod (services/runner/internal/executor/kube_spec.go: the
// managed-by label, and some of the per-launch ones).
var agentPodLabels = map[string]string{
	"app.kubernetes.io/managed-by": "conclave-runner",
	"conclave.ai/agent-type":       "acp-agent",
	"conclave.ai/launch":           "1",
}

// TestKubernetesExecutor renders the runner with each executor and checks
// its settings, the volume of its workspaces, its Role, the agents'
// ServiceAccount and agent types, and that the NetworkPolicies let agent
// pods reach the replica that launched them (and DNS and the bus) and
// nothing else. The Kubernetes executor is the default.
func TestKubernetesExecutor(t *testing.T) {
	t.Parallel()
	hostKey := corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "conclave-runner-tokens"}, Key: "host-key"}
	for _, tc := range []struct {
		name string
		set  []string
		// env is every CONCLAVE_RUNNER_EXECUTOR, _HOST_* and _KUBE_* value
		// the runner gets ("" for one from a Secret).
		env            map[string]string
		workspaceRoot  string
		claim          string
		agentNamespace string // "" with the local executor
		// agentAccount is the agents' ServiceAccount the chart makes ("":
		// none).
		agentAccount string
		// exampleImage is the example agent type's image ("": the chart
		// gives the runner no agent types file).
		exampleImage string
		egressRule   bool // runner.kubernetes.networkPolicy.egress is set
		jaeger       bool // jaeger.enabled
	}{
		{
			name:          "local",
			set:           []string{"runner.executor=local"},
			env:           map[string]string{"CONCLAVE_RUNNER_EXECUTOR": "local"},
			workspaceRoot: "/workspace",
		},
		{
			name: "defaults",
			set:  []string{"image.registry=registry.example.com/", "agentHost.image.tag=v7", "imagePullSecrets[0].name=registry"},
			env: map[string]string{
				"CONCLAVE_RUNNER_EXECUTOR":                "kubernetes",
				"CONCLAVE_RUNNER_HOST_KEY":                "",
				"CONCLAVE_RUNNER_HOST_ADDR":               "$(POD_IP):50052",
				"CONCLAVE_RUNNER_HOST_GATEWAY_ADDR":       "conclave-gateway.conclave.svc:50051",
				"CONCLAVE_RUNNER_KUBE_NAMESPACE":          "conclave",
				"CONCLAVE_RUNNER_KUBE_HOST_IMAGE":         "registry.example.com/conclave/agent-host:v7",
				"CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT":    "conclave-agents",
				"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY":  "IfNotPresent",
				"CONCLAVE_RUNNER_KUBE_RUN_AS_NON_ROOT":    "true",
				"CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT":    "/workspace",
				"CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED": "10m",
				"CONCLAVE_RUNNER_KUBE_START_GRACE":        "2m",
				"CONCLAVE_RUNNER_KUBE_SECRET_ENV":         "*_AUTH,*_TOKEN,*_KEY",
			},
			workspaceRoot:  "/workspace",
			agentNamespace: "conclave",
			agentAccount:   "conclave-agents",
			exampleImage:   "registry.example.com/conclave/acp-agent:" + chartAppVersion(t),
		},
		{
			name: "kubernetes in another namespace with a workspace claim",
			set: []string{
				"runner.executor=kubernetes", "runner.service.grpcPort=6000",
				"runner.settings.hostStartTimeout=10m", "runner.settings.hostExitGrace=1m",
				"runner.kubernetes.namespace=agents", "runner.kubernetes.hostImage=ghcr.io/me/agent-host:2",
				"runner.kubernetes.imagePullPolicy=Always", "runner.kubernetes.serviceAccount.name=agent",
				"exampleAgent.image.repository=ghcr.io/me/acp-agent", "exampleAgent.image.tag=v3",
				"runner.kubernetes.runAsNonRoot=false",
				"runner.kubernetes.workspaceClaim=workspaces", "runner.kubernetes.workspaceRoot=/claims",
				"runner.kubernetes.workspaceMount=/src", "runner.kubernetes.ttlAfterFinished=1h",
				"runner.kubernetes.startGrace=45s", "runner.kubernetes.secretEnv={*_SECRET,OPENAI_*}",
				"runner.kubernetes.networkPolicy.egress[0].ports[0].port=443",
			},
			env: map[string]string{
				"CONCLAVE_RUNNER_EXECUTOR":                "kubernetes",
				"CONCLAVE_RUNNER_HOST_KEY":                "",
				"CONCLAVE_RUNNER_HOST_ADDR":               "$(POD_IP):6000",
				"CONCLAVE_RUNNER_HOST_GATEWAY_ADDR":       "conclave-gateway.conclave.svc:50051",
				"CONCLAVE_RUNNER_HOST_START_TIMEOUT":      "10m",
				"CONCLAVE_RUNNER_HOST_EXIT_GRACE":         "1m",
				"CONCLAVE_RUNNER_KUBE_NAMESPACE":          "agents",
				"CONCLAVE_RUNNER_KUBE_HOST_IMAGE":         "ghcr.io/me/agent-host:2",
				"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY":  "Always",
				"CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT":    "agent",
				"CONCLAVE_RUNNER_KUBE_RUN_AS_NON_ROOT":    "false",
				"CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM":    "workspaces",
				"CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT":     "/claims",
				"CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT":    "/src",
				"CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED": "1h",
				"CONCLAVE_RUNNER_KUBE_START_GRACE":        "45s",
				"CONCLAVE_RUNNER_KUBE_SECRET_ENV":         "*_SECRET,OPENAI_*",
			},
			workspaceRoot:  "/claims",
			claim:          "workspaces",
			agentNamespace: "agents",
			agentAccount:   "agent",
			exampleImage:   "ghcr.io/me/acp-agent:v3",
			egressRule:     true,
		},
		{
			// The namespace's own ServiceAccount, and agent types of the
			// operator's, which replace the example's.
			name: "kubernetes with the dev Jaeger",
			set: []string{
				"runner.executor=kubernetes", "runner.kubernetes.namespace=agents", "jaeger.enabled=true",
				"runner.kubernetes.serviceAccount.create=false", "runner.agentTypes=agent_types: []",
			},
			env: map[string]string{
				"CONCLAVE_RUNNER_EXECUTOR":                "kubernetes",
				"CONCLAVE_RUNNER_HOST_KEY":                "",
				"CONCLAVE_RUNNER_HOST_ADDR":               "$(POD_IP):50052",
				"CONCLAVE_RUNNER_HOST_GATEWAY_ADDR":       "conclave-gateway.conclave.svc:50051",
				"CONCLAVE_RUNNER_HOST_OTLP_ENDPOINT":      "conclave-jaeger.conclave.svc:4317",
				"CONCLAVE_RUNNER_KUBE_NAMESPACE":          "agents",
				"CONCLAVE_RUNNER_KUBE_HOST_IMAGE":         "conclave/agent-host:" + chartAppVersion(t),
				"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY":  "IfNotPresent",
				"CONCLAVE_RUNNER_KUBE_RUN_AS_NON_ROOT":    "true",
				"CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT":    "/workspace",
				"CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED": "10m",
				"CONCLAVE_RUNNER_KUBE_START_GRACE":        "2m",
				"CONCLAVE_RUNNER_KUBE_SECRET_ENV":         "*_AUTH,*_TOKEN,*_KEY",
			},
			workspaceRoot:  "/workspace",
			agentNamespace: "agents",
			jaeger:         true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := indexIn(t, render(t, nil, tc.set...), "conclave", "agents")
			for _, d := range deployables {
				checkDeployable(t, r, d)
			}
			runner := r.deployments[release+"-runner"]
			spec := runner.Spec.Template.Spec
			c := spec.Containers[0]

			got := map[string]string{}
			for _, e := range c.Env {
				if !strings.HasPrefix(e.Name, "CONCLAVE_RUNNER_EXECUTOR") && !strings.HasPrefix(e.Name, "CONCLAVE_RUNNER_HOST_") && !strings.HasPrefix(e.Name, "CONCLAVE_RUNNER_KUBE_") {
					continue
				}
				got[e.Name] = e.Value
				if e.Name == "CONCLAVE_RUNNER_HOST_KEY" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || *e.ValueFrom.SecretKeyRef != hostKey) {
					t.Errorf("CONCLAVE_RUNNER_HOST_KEY comes from %+v, want the runner's Secret's key host-key", e.ValueFrom)
				}
			}
			if !maps.Equal(got, tc.env) {
				t.Errorf("the runner's executor settings are\n  %v\nwant\n  %v", got, tc.env)
			}
			if env := envOf(runner); env["CONCLAVE_RUNNER_WORKSPACE_ROOTS"] != tc.workspaceRoot {
				t.Errorf("CONCLAVE_RUNNER_WORKSPACE_ROOTS=%q, want %q", env["CONCLAVE_RUNNER_WORKSPACE_ROOTS"], tc.workspaceRoot)
			}
			checkWorkspaceVolume(t, spec, tc.workspaceRoot, tc.claim)

			kube := tc.agentNamespace != ""
			if token := spec.AutomountServiceAccountToken; token == nil || *token != kube {
				t.Errorf("the runner's pods mount a ServiceAccount token: %v, want %v (only the Kubernetes executor calls the API server)", token, kube)
			}
			if sa := r.serviceAccounts[spec.ServiceAccountName]; sa == nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken != kube {
				t.Errorf("the runner's ServiceAccount automounts its token: %v, want %v", sa, kube)
			}
			if kube {
				checkRunnerRole(t, r, tc.agentNamespace)
			} else if len(r.roles)+len(r.bindings) > 0 {
				t.Errorf("the local executor gets Roles %v and bindings %v, want none", r.roles, r.bindings)
			}
			checkAgentServiceAccount(t, r, tc.agentNamespace, tc.agentAccount)
			checkExampleAgentType(t, r, tc.exampleImage)
			checkAgentNetworkPolicies(t, r, tc.agentNamespace, tc.egressRule, tc.jaeger)
		})
	}
}

// checkAgentServiceAccount checks the agents' ServiceAccount the chart
// makes: name in namespace, no token automounted, the chart's
// imagePullSecrets, bound to nothing, and the runner's agents' pods run as
// it. An empty name: the chart makes none.
func checkAgentServiceAccount(t *testing.T, r rendered, namespace, name string) {
	t.Helper()
	runner := r.deployments[release+"-runner"]
	env := envOf(runner)
	var agents []*corev1.ServiceAccount
	for _, sa := range r.serviceAccounts {
		if sa.Labels["app.kubernetes.io/component"] == "agents" {
			agents = append(agents, sa)
		}
	}
	if name == "" {
		if len(agents) > 0 {
			t.Errorf("the chart makes agents' ServiceAccounts %v, want none", agents)
		}
		if sa, ok := env["CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT"]; ok {
			t.Errorf("CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT=%q, want it unset (the namespace's default)", sa)
		}
		return
	}
	if len(agents) != 1 || agents[0].Name != name || agents[0].Namespace != namespace {
		t.Fatalf("the agents' ServiceAccounts are %v, want %s in %s", agents, name, namespace)
	}
	sa := agents[0]
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s automounts its token: %v", name, sa.AutomountServiceAccountToken)
	}
	if got, want := sa.ImagePullSecrets, runner.Spec.Template.Spec.ImagePullSecrets; !slices.Equal(got, want) {
		t.Errorf("ServiceAccount %s pulls with %v, the chart's imagePullSecrets are %v", name, got, want)
	}
	for _, b := range r.bindings {
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == name && s.Namespace == namespace {
				t.Errorf("RoleBinding %s gives the agents' ServiceAccount %s the rights of %s %s", b.Name, name, b.RoleRef.Kind, b.RoleRef.Name)
			}
		}
	}
	if got := env["CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT"]; got != name {
		t.Errorf("CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT=%q, want %s", got, name)
	}
}

// checkExampleAgentType checks the runner's agent types are the example
// agent's, in image; an empty image: the chart gives it none of its own.
func checkExampleAgentType(t *testing.T, r rendered, image string) {
	t.Helper()
	cm, ok := r.configMaps[release+"-runner-agent-types"]
	if image == "" {
		if ok && strings.Contains(cm.Data["agent-types.yaml"], "acp-agent") {
			t.Errorf("the runner gets the example agent's type:\n%s", cm.Data["agent-types.yaml"])
		}
		return
	}
	if !ok {
		t.Fatal("no agent types ConfigMap: the runner has no agent type it can run in a Job")
	}
	var file struct {
		AgentTypes []map[string]any `json:"agent_types"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["agent-types.yaml"]), &file); err != nil {
		t.Fatalf("the agent types file: %v\n%s", err, cm.Data["agent-types.yaml"])
	}
	if len(file.AgentTypes) != 1 {
		t.Fatalf("agent types %v, want the example agent's only", file.AgentTypes)
	}
	typ := file.AgentTypes[0]
	for key, want := range map[string]any{
		"id": "acp-agent", "image": image, "command": []any{"/usr/local/bin/acp-agent"},
		"protocol": "acp", "enabled": true,
	} {
		if !reflect.DeepEqual(typ[key], want) {
			t.Errorf("the example agent type's %s is %v, want %v", key, typ[key], want)
		}
	}
	// The runner's default permission, deny: the example has no business
	// with the operator's files.
	if p, ok := typ["permission"]; ok {
		t.Errorf("the example agent type's permission is %v, want the runner's default", p)
	}
	spec := r.deployments[release+"-runner"].Spec.Template.Spec
	if envOf(r.deployments[release+"-runner"])["CONCLAVE_RUNNER_AGENT_TYPES"] == "" ||
		!slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.ConfigMap != nil && v.ConfigMap.Name == cm.Name
		}) {
		t.Errorf("the runner does not mount the agent types ConfigMap %s", cm.Name)
	}
}

func checkWorkspaceVolume(t *testing.T, spec corev1.PodSpec, root, claim string) {
	t.Helper()
	mounts := spec.Containers[0].VolumeMounts
	i := slices.IndexFunc(mounts, func(m corev1.VolumeMount) bool { return m.Name == "workspace" })
	if i < 0 || mounts[i].MountPath != root {
		t.Errorf("the runner's workspace volume is mounted at %+v, want %s", mounts, root)
	}
	j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "workspace" })
	if j < 0 {
		t.Fatal("the runner has no workspace volume")
	}
	v := spec.Volumes[j]
	switch {
	case claim == "" && v.EmptyDir == nil:
		t.Errorf("workspace volume %+v, want an emptyDir", v.VolumeSource)
	case claim != "" && (v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != claim):
		t.Errorf("workspace volume %+v, want the claim %s", v.VolumeSource, claim)
	}
}

// checkAgentNetworkPolicies checks, by evaluating the rendered policies,
// who reaches whom: agent pods reach the runner's gRPC port (not its HTTP
// one), the bus, DNS and the dev Jaeger's OTLP port when there is one, and
// nothing else unless an egress rule was added; nothing reaches an agent
// pod. With agentNamespace "" (the local executor) no policy mentions agent
// pods.
func checkAgentNetworkPolicies(t *testing.T, r rendered, agentNamespace string, egressRule, jaeger bool) {
	t.Helper()
	runnerPolicy := r.netpols[release+"-runner"]
	runnerLabels := r.deployments[release+"-runner"].Spec.Template.Labels
	busLabels := r.deployments[release+"-bus"].Spec.Template.Labels
	gatewayLabels := r.deployments[release+"-gateway"].Spec.Template.Labels
	grpcPort := r.deployments[release+"-runner"].Spec.Template.Spec.Containers[0].Ports[0]
	if grpcPort.Name != "grpc" {
		t.Fatalf("the runner's first port is %s, not grpc", grpcPort.Name)
	}
	agents, ok := r.netpols[release+"-agents"]
	if agentNamespace == "" {
		if ok {
			t.Errorf("the local executor gets a NetworkPolicy for agent pods")
		}
		if ingressAllows(runnerPolicy, agentPodLabels, "conclave", "grpc", grpcPort.ContainerPort) {
			t.Errorf("the local executor's runner takes connections from agent pods")
		}
		return
	}
	if !ok {
		t.Fatalf("no NetworkPolicy %s-agents for the agents' pods", release)
	}
	if agents.Namespace != agentNamespace || !selects(agents.Spec.PodSelector.MatchLabels, agentPodLabels) {
		t.Errorf("NetworkPolicy %s in %s selects %v, want agent pods in %s", agents.Name, agents.Namespace, agents.Spec.PodSelector.MatchLabels, agentNamespace)
	}
	if selects(agents.Spec.PodSelector.MatchLabels, runnerLabels) || selects(runnerPolicy.Spec.PodSelector.MatchLabels, agentPodLabels) {
		t.Errorf("the agents' and the runner's policies select each other's pods")
	}

	if !ingressAllows(runnerPolicy, agentPodLabels, agentNamespace, "grpc", grpcPort.ContainerPort) {
		t.Errorf("agent pods in %s may not reach the runner's gRPC port", agentNamespace)
	}
	if agentNamespace != "conclave" && ingressAllows(runnerPolicy, agentPodLabels, "conclave", "grpc", grpcPort.ContainerPort) {
		t.Errorf("pods labelled as agents in the release's namespace reach the runner, want only those in %s", agentNamespace)
	}
	if ingressAllows(runnerPolicy, agentPodLabels, agentNamespace, "http", 8082) {
		t.Errorf("agent pods may reach the runner's HTTP port")
	}
	if !ingressAllows(r.netpols[release+"-bus"], agentPodLabels, agentNamespace, "http", 7892) {
		t.Errorf("agent pods may not reach the bus")
	}
	if !ingressAllows(r.netpols[release+"-gateway"], agentPodLabels, agentNamespace, "grpc", 50051) {
		t.Errorf("agent pods may not reach the gateway's AgentStream")
	}
	jaegerLabels := map[string]string{}
	if jaeger {
		jaegerLabels = r.deployments[release+"-jaeger"].Spec.Template.Labels
		if !ingressAllows(r.netpols[release+"-jaeger"], agentPodLabels, agentNamespace, "otlp-grpc", 4317) {
			t.Errorf("agent pods may not send spans to the dev Jaeger")
		}
	}

	for _, to := range []struct {
		what   string
		labels map[string]string
		ns     string
		port   int32
		proto  corev1.Protocol
		want   bool
	}{
		{"the runner's gRPC port", runnerLabels, "conclave", grpcPort.ContainerPort, corev1.ProtocolTCP, true},
		{"the runner's HTTP port", runnerLabels, "conclave", 8082, corev1.ProtocolTCP, false},
		{"the bus", busLabels, "conclave", 7892, corev1.ProtocolTCP, true},
		// agent-host registers its agent at the gateway.
		{"the gateway's gRPC port", gatewayLabels, "conclave", 50051, corev1.ProtocolTCP, true},
		{"the gateway's HTTP port", gatewayLabels, "conclave", 8080, corev1.ProtocolTCP, false},
		{"DNS over UDP", map[string]string{"k8s-app": "kube-dns"}, "kube-system", 53, corev1.ProtocolUDP, true},
		{"DNS over TCP", map[string]string{"k8s-app": "kube-dns"}, "kube-system", 53, corev1.ProtocolTCP, true},
		{"another pod's gRPC port", map[string]string{"app": "database"}, "conclave", grpcPort.ContainerPort, corev1.ProtocolTCP, false},
		{"a pod elsewhere on 443", map[string]string{"app": "model-api"}, "models", 443, corev1.ProtocolTCP, egressRule},
		{"the dev Jaeger's OTLP port", jaegerLabels, "conclave", 4317, corev1.ProtocolTCP, jaeger},
	} {
		if got := egressAllows(agents, to.labels, to.ns, to.port, to.proto); got != to.want {
			t.Errorf("agent pods reach %s: %v, want %v", to.what, got, to.want)
		}
	}
	if !slices.Contains(agents.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || len(agents.Spec.Ingress) != 0 {
		t.Errorf("agent pods take connections: policy types %v, ingress %v", agents.Spec.PolicyTypes, agents.Spec.Ingress)
	}
}

// peerMatches reports whether peer selects a pod with labels in namespace
// ns, for a policy in policyNamespace. Only the matchLabels selectors the
// chart writes are evaluated; an ipBlock matches no pod here.
func peerMatches(peer networkingv1.NetworkPolicyPeer, policyNamespace string, labels map[string]string, ns string) bool {
	if peer.IPBlock != nil {
		return false
	}
	if peer.NamespaceSelector == nil {
		if ns != policyNamespace {
			return false
		}
	} else if !matchLabels(peer.NamespaceSelector.MatchLabels, map[string]string{"kubernetes.io/metadata.name": ns}) {
		return false
	}
	return peer.PodSelector == nil || matchLabels(peer.PodSelector.MatchLabels, labels)
}

// matchLabels is a label selector's matchLabels: an empty one selects all.
func matchLabels(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func portMatches(ports []networkingv1.NetworkPolicyPort, name string, number int32, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		protocol := corev1.ProtocolTCP
		if p.Protocol != nil {
			protocol = *p.Protocol
		}
		if protocol != proto {
			continue
		}
		if p.Port == nil || (p.Port.StrVal != "" && p.Port.StrVal == name) || (p.Port.StrVal == "" && p.Port.IntVal == number) {
			return true
		}
	}
	return false
}

// ingressAllows reports whether np lets a pod with labels in namespace ns
// connect to port (its container port's name and number) over TCP.
func ingressAllows(np *networkingv1.NetworkPolicy, labels map[string]string, ns, portName string, port int32) bool {
	for _, rule := range np.Spec.Ingress {
		if !portMatches(rule.Ports, portName, port, corev1.ProtocolTCP) {
			continue
		}
		if len(rule.From) == 0 {
			return true
		}
		for _, peer := range rule.From {
			if peerMatches(peer, np.Namespace, labels, ns) {
				return true
			}
		}
	}
	return false
}

// egressAllows reports whether np lets its pods connect to a pod with
// labels in namespace ns on port.
func egressAllows(np *networkingv1.NetworkPolicy, labels map[string]string, ns string, port int32, proto corev1.Protocol) bool {
	for _, rule := range np.Spec.Egress {
		if !portMatches(rule.Ports, "", port, proto) {
			continue
		}
		if len(rule.To) == 0 {
			return true
		}
		for _, peer := range rule.To {
			if peerMatches(peer, np.Namespace, labels, ns) {
				return true
			}
		}
	}
	return false
}

// chartAppVersion is Chart.yaml's appVersion, the images' default tag.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml's appVersion: %q, %v", chart.AppVersion, err)
	}
	return chart.AppVersion
}
