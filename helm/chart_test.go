package helm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	chartDir = "conclave"
	release  = "conclave"
	// kubeVersion is the cluster version helm renders for: the node tests'
	// (tools/k8s). TestTemplateWithoutKubeVersion renders for helm's own
	// default.
	kubeVersion = "1.34.0"
)

// helmBinary finds helm: CONCLAVE_HELM, else the repository's .cache/bin
// (built by `make test-tools`).
func helmBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs helm; skipped with -short")
	}
	path := os.Getenv("CONCLAVE_HELM")
	if path == "" {
		path = filepath.Join(repoRoot(t), ".cache", "bin", "helm")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("helm not found (%v): run `make test-tools` or set CONCLAVE_HELM", err)
	}
	return path
}

// runHelm runs helm with args and returns its stdout, or its stderr as the
// error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// helm keeps its caches and config under HOME; keep them out of the user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valuesFiles are the values the chart is checked with: its defaults, the
// two shipped files, and one that turns every optional part on and sets
// every setting the schema allows (built by allSettingsValues).
var valuesFiles = map[string][]string{
	"default": nil,
	"dev":     {"conclave/values-dev.yaml"},
	"aws":     {"conclave/values-aws.yaml"},
}

func TestLint(t *testing.T) {
	t.Parallel()
	for name, files := range valuesFiles {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := []string{"lint", chartDir, "--strict", "--kube-version", kubeVersion}
			for _, f := range files {
				args = append(args, "-f", f)
			}
			if out, err := runHelm(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestTemplateWithoutKubeVersion renders the default values for the
// Kubernetes version helm assumes without a cluster or --kube-version
// (helm's release build, and scripts/build-test-tools.sh, make it the
// client-go version helm is built with), which must satisfy Chart.yaml's
// kubeVersion: `helm template helm/conclave` works as it comes.
func TestTemplateWithoutKubeVersion(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"template": {"template", release, chartDir, "--namespace", "conclave"},
		"lint":     {"lint", chartDir, "--strict"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if name == "template" {
				r := index(t, decodeStrict(t, out))
				if env := envOf(r.deployments[release+"-runner"]); env["CONCLAVE_RUNNER_EXECUTOR"] != "kubernetes" {
					t.Errorf("the default runner's executor is %q, want kubernetes", env["CONCLAVE_RUNNER_EXECUTOR"])
				}
			}
		})
	}
}

// render runs helm template and decodes every object strictly into its
// client-go type: an unknown or duplicated field fails.
func render(t *testing.T, files []string, set ...string) []runtime.Object {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", "conclave", "--kube-version", kubeVersion}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeStrict(t, out)
}

var strictDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		autoscalingv2.AddToScheme, rbacv1.AddToScheme, networkingv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

func decodeStrict(t *testing.T, manifest string) []runtime.Object {
	t.Helper()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var objs []runtime.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		if len(probe) == 0 {
			continue // a template that rendered nothing
		}
		if probe["apiVersion"] == "monitoring.coreos.com/v1" && probe["kind"] == "PrometheusRule" {
			// No client-go type: compare it with the rules it wraps.
			checkPrometheusRule(t, probe)
			continue
		}
		obj, gvk, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decoding %v strictly: %v\n%s", gvk, err, doc)
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered no objects")
	}
	return objs
}

// rendered indexes a render's objects by kind and name.
type rendered struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols         map[string]*networkingv1.NetworkPolicy
	roles           map[string]*rbacv1.Role
	bindings        map[string]*rbacv1.RoleBinding
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
}

func index(t *testing.T, objs []runtime.Object) rendered {
	t.Helper()
	return indexIn(t, objs, "conclave")
}

// indexIn is index for a render whose objects may be in any of namespaces
// (the Kubernetes executor's agents' namespace besides the release's).
func indexIn(t *testing.T, objs []runtime.Object, namespaces ...string) rendered {
	t.Helper()
	r := rendered{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, netpols: map[string]*networkingv1.NetworkPolicy{},
		roles: map[string]*rbacv1.Role{}, bindings: map[string]*rbacv1.RoleBinding{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{},
	}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.deployments[o.Name] = o
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.ServiceAccount:
			r.serviceAccounts[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			r.pdbs[o.Name] = o
		case *autoscalingv2.HorizontalPodAutoscaler:
			r.hpas[o.Name] = o
		case *networkingv1.NetworkPolicy:
			r.netpols[o.Name] = o
		case *rbacv1.Role:
			r.roles[o.Name] = o
		case *rbacv1.RoleBinding:
			r.bindings[o.Name] = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Secret:
			r.secrets[o.Name] = o
		default:
			t.Fatalf("the chart renders a %T, which this test does not check", obj)
		}
		if ns := obj.(interface{ GetNamespace() string }).GetNamespace(); !slices.Contains(namespaces, ns) {
			t.Errorf("%T %v is in namespace %q, not one of %q", obj, obj, ns, namespaces)
		}
	}
	return r
}

// podEnvHelpers are env vars the chart sets that are no Conclave setting:
// POD_IP only other values expand; the AWS SDK reads the static credentials
// of aws.credentialsSecret.
var podEnvHelpers = []string{"POD_IP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

// secretSettings must come from a Secret, never a literal value.
var secretSettings = regexp.MustCompile(`_(CLIENT_TOKENS|AGENT_TOKENS|ADMIN_TOKENS|LIBRARIAN_TOKENS|GRANTS|PEER_TOKEN|RUNNER_TOKEN|HOST_KEY|SESSION_KEY|BUS_TOKEN|GATEWAY_TOKEN)$|^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY)$`)

func TestTemplate(t *testing.T) {
	t.Parallel()
	allSettings := allSettingsValues(t)
	cases := map[string][]string{"all-settings": {allSettings}}
	for name, files := range valuesFiles {
		cases[name] = files
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := index(t, render(t, files))
			for _, d := range deployables {
				checkDeployable(t, r, d)
			}
			checkConsole(t, r, nil)
			// Every one runs the Kubernetes executor, the default.
			checkRunnerRole(t, r, "conclave")
			agents := release + "-agents"
			if name == "all-settings" {
				agents = "agents"
			}
			checkAgentServiceAccount(t, r, "conclave", agents)
			// Only devSecrets.generate (the dev values) makes a Secret:
			// otherwise tokens are the operator's, never chart values.
			if name != "dev" && len(r.secrets) > 0 {
				t.Errorf("the %s values render Secrets %v, want none", name, keys(r.secrets))
			}
			if name == "all-settings" {
				checkBusAddresses(t, r, allSettingsRunnerAddr, allSettingsBusURL)
			} else {
				checkBusAddresses(t, r, release+"-runner:50052", "ws://"+release+"-bus.conclave.svc:7892")
			}
			switch name {
			case "dev":
				checkDev(t, r)
			case "aws":
				checkAWS(t, r)
			case "all-settings":
				if len(r.hpas) != len(deployables) {
					t.Errorf("%d HPAs, want one per deployable", len(r.hpas))
				}
				if cm, ok := r.configMaps[release+"-runner-agent-types"]; !ok || cm.Data["agent-types.yaml"] != allSettingsAgentTypes {
					t.Errorf("the agent types ConfigMap %v does not hold runner.agentTypes %q", cm, allSettingsAgentTypes)
				}
				checkObservability(t, r)
				checkGovernanceSecrets(t, r)
			}
		})
	}
}

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

func checkDeployable(t *testing.T, r rendered, name string) {
	t.Helper()
	full := release + "-" + name
	d, ok := r.deployments[full]
	if !ok {
		t.Fatalf("no Deployment %s", full)
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", full, len(spec.Containers))
	}
	c := spec.Containers[0]
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: pod does not require a non-root user", full)
	}
	if _, ok := r.serviceAccounts[spec.ServiceAccountName]; !ok {
		t.Errorf("%s runs as ServiceAccount %q, which the chart does not create", full, spec.ServiceAccountName)
	}

	// Probes: liveness on /healthz, readiness on /readyz, both on the
	// container's http port (pkg/server serves them on every HTTP listener).
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for probeName, probe := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}, "startup": {c.StartupProbe, "/healthz"}} {
		if probe.p == nil || probe.p.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", full, probeName)
			continue
		}
		if probe.p.HTTPGet.Path != probe.path || probe.p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("%s: %s probe on %s port %s, want %s on http", full, probeName, probe.p.HTTPGet.Path, probe.p.HTTPGet.Port.String(), probe.path)
		}
	}
	if _, ok := ports["http"]; !ok {
		t.Errorf("%s: no container port named http", full)
	}
	// A preStop sleep holds the listeners open while the endpoints drop
	// a deleted pod, inside the grace period.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		t.Errorf("%s: no preStop sleep (%+v)", full, c.Lifecycle)
	} else if g := spec.TerminationGracePeriodSeconds; g == nil || c.Lifecycle.PreStop.Sleep.Seconds >= *g {
		t.Errorf("%s: preStop sleep of %ds does not fit in the grace period %v", full, c.Lifecycle.PreStop.Sleep.Seconds, g)
	}

	// Env: every name is a setting the deployable's code reads.
	tags := envTags(t, name)
	declared := map[string]bool{}
	env := map[string]string{}
	for _, e := range c.Env {
		if declared[e.Name] {
			t.Errorf("%s: env %s set twice", full, e.Name)
		}
		if !tags[e.Name] && !slices.Contains(podEnvHelpers, e.Name) {
			t.Errorf("%s: env %s is not a setting of the %s (no env tag in its Config); the chart has drifted from the code", full, e.Name, name)
		}
		if secretSettings.MatchString(e.Name) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("%s: %s is not taken from a Secret", full, e.Name)
		}
		for _, ref := range regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`).FindAllStringSubmatch(e.Value, -1) {
			// The kubelet declares a Service's variables for every pod
			// (a value given for a cluster without DNS uses them).
			if !declared[ref[1]] && !serviceVariable.MatchString(ref[1]) {
				t.Errorf("%s: env %s expands $(%s), which is not declared before it", full, e.Name, ref[1])
			}
		}
		declared[e.Name] = true
		env[e.Name] = e.Value
	}
	// The listener addresses the chart sets must be the ports it exposes.
	for envName, port := range map[string]string{
		"CONCLAVE_GATEWAY_GRPC_ADDR": "grpc", "CONCLAVE_GATEWAY_HTTP_ADDR": "http",
		"CONCLAVE_BUS_ADDR":         "http",
		"CONCLAVE_RUNNER_GRPC_ADDR": "grpc", "CONCLAVE_RUNNER_HTTP_ADDR": "http",
		"CONCLAVE_CONSOLE_HTTP_ADDR": "http",
	} {
		if !strings.HasPrefix(envName, "CONCLAVE_"+strings.ToUpper(name)+"_") {
			continue
		}
		if want := fmt.Sprintf(":%d", ports[port]); env[envName] != want {
			t.Errorf("%s: %s=%q, want %q (the %s container port)", full, envName, env[envName], want, port)
		}
	}

	svc, ok := r.services[full]
	if !ok {
		t.Fatalf("no Service %s", full)
	}
	for _, p := range svc.Spec.Ports {
		if _, ok := ports[p.TargetPort.StrVal]; !ok {
			t.Errorf("Service %s port %s targets %q, no container port of %s", full, p.Name, p.TargetPort.String(), full)
		}
	}
	if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Service %s does not select %s's pods", full, full)
	}
	if pdb, ok := r.pdbs[full]; ok && !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget %s does not select %s's pods", full, full)
	}
	if np, ok := r.netpols[full]; ok {
		if !selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("NetworkPolicy %s does not select %s's pods", full, full)
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if _, ok := ports[p.Port.StrVal]; !ok {
					t.Errorf("NetworkPolicy %s opens port %s, no container port of %s", full, p.Port.String(), full)
				}
			}
		}
	} else {
		t.Errorf("no NetworkPolicy %s", full)
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkRunnerRole holds the runner's Role to exactly what the Kubernetes
// executor needs, in the agents' namespace, bound to its ServiceAccount.
func checkRunnerRole(t *testing.T, r rendered, agentNamespace string) {
	t.Helper()
	name := release + "-runner"
	role, ok := r.roles[name]
	if !ok {
		t.Fatalf("no Role %s", name)
	}
	if role.Namespace != agentNamespace {
		t.Errorf("Role %s is in namespace %s, want the agents' %s", name, role.Namespace, agentNamespace)
	}
	want := []string{
		// services/runner/internal/executor's runnerRoleRules: its tests
		// run the executor bound to exactly these.
		"batch/jobs:create,delete,get,list,watch",
		"/secrets:create,delete,patch",
		"/pods:list,watch",
	}
	var got []string
	for _, rule := range role.Rules {
		verbs := slices.Clone(rule.Verbs)
		sort.Strings(verbs)
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				got = append(got, g+"/"+res+":"+strings.Join(verbs, ","))
			}
		}
		if len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
			t.Errorf("Role %s: unexpected rule %+v", name, rule)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Role %s grants\n  %v\nwant exactly\n  %v", name, got, want)
	}
	b, ok := r.bindings[name]
	if !ok {
		t.Fatalf("no RoleBinding %s", name)
	}
	if b.RoleRef.Kind != "Role" || b.RoleRef.Name != name {
		t.Errorf("RoleBinding %s binds %s %s", name, b.RoleRef.Kind, b.RoleRef.Name)
	}
	if b.Namespace != agentNamespace {
		t.Errorf("RoleBinding %s is in namespace %s, want the agents' %s", name, b.Namespace, agentNamespace)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != r.deployments[name].Spec.Template.Spec.ServiceAccountName ||
		b.Subjects[0].Namespace != "conclave" {
		t.Errorf("RoleBinding %s subjects %+v, want the runner's ServiceAccount (in the release's namespace) only", name, b.Subjects)
	}
}

func envOf(d *appsv1.Deployment) map[string]string {
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
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

// serviceVariable is a variable the kubelet gives every pod for each
// Service of its namespace.
var serviceVariable = regexp.MustCompile(`^[A-Z0-9_]+_SERVICE_(HOST|PORT(_[A-Z0-9_]+)?)$`)

// modulePrefix is the import path prefix of this repository's packages.
const modulePrefix = "github.com/conclave-ai/conclave/"

// envTags reads the env tags of everything a deployable's process loads:
// its service package's Config and the appConfig its main (or Serve)
// loads, following the structs they hold, embedded or as named fields
// (pkg/config's Common and Storage, the runner's executor.KubeConfig),
// into this repository's other packages. The console's appConfig holds no
// config.Storage, so no storage setting is one of its settings.
func envTags(t *testing.T, name string) map[string]bool {
	t.Helper()
	root := repoRoot(t)
	tags := map[string]bool{}
	seen := map[string]bool{}
	var collect func(dir string, typeNames ...string)
	collect = func(dir string, typeNames ...string) {
		var want []string
		for _, typ := range typeNames {
			if !seen[dir+"."+typ] {
				seen[dir+"."+typ] = true
				want = append(want, typ)
			}
		}
		if len(want) == 0 {
			return
		}
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			imports := map[string]string{}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				local := p[strings.LastIndex(p, "/")+1:]
				if imp.Name != nil {
					local = imp.Name.Name
				}
				imports[local] = p
			}
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok || !slices.Contains(want, ts.Name.Name) {
					return true
				}
				ast.Inspect(ts.Type, func(n ast.Node) bool {
					field, ok := n.(*ast.Field)
					if !ok {
						return true
					}
					if field.Tag != nil {
						tag, err := strconv.Unquote(field.Tag.Value)
						if err != nil {
							t.Fatalf("%s: %v", path, err)
						}
						if env := reflect.StructTag(tag).Get("env"); env != "" {
							tags[env] = true
						}
					}
					// Embedded or named, a struct field's own fields are
					// settings too (config.Load walks both).
					switch typ := field.Type.(type) {
					case *ast.Ident:
						if types.Universe.Lookup(typ.Name) == nil { // not string, int, ...
							collect(dir, typ.Name)
						}
					case *ast.SelectorExpr:
						pkg, ok := typ.X.(*ast.Ident)
						if !ok {
							break
						}
						if rel, ok := strings.CutPrefix(imports[pkg.Name], modulePrefix); ok {
							collect(filepath.Join(root, filepath.FromSlash(rel)), typ.Sel.Name)
						}
					}
					return true
				})
				return false
			})
		}
	}
	collect(filepath.Join(root, "services", name, "service"), "Config", "appConfig")
	collect(filepath.Join(root, "services", name, "cmd", name), "appConfig")
	must := []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "CONCLAVE_LOG_LEVEL", "CONCLAVE_" + strings.ToUpper(name) + "_SHUTDOWN_TIMEOUT"}
	if slices.Contains(storeDeployables, name) {
		must = append(must, "CONCLAVE_BACKEND", "CONCLAVE_TABLE_PREFIX", "AWS_REGION")
	}
	for _, tag := range must {
		if !tags[tag] {
			t.Fatalf("%s: found no %s tag; has the configuration moved?", name, tag)
		}
	}
	return tags
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

// TestDecodeStrictRejectsUnknownFields makes sure the strict decoding the
// chart's checks rely on does fail on a field its type lacks.
func TestDecodeStrictRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	doc := []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPrt: http\n")
	if _, _, err := strictDecoder.Decode(doc, nil, nil); err == nil || !strings.Contains(err.Error(), "targetPrt") {
		t.Fatalf("strict decoding of an unknown field: err = %v, want one naming targetPrt", err)
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
