package helm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// TestDecodeStrictRejectsUnknownFields makes sure the strict decoding the
// chart's checks rely on does fail on a field its type lacks.
func TestDecodeStrictRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	doc := []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPrt: http\n")
	if _, _, err := strictDecoder.Decode(doc, nil, nil); err == nil || !strings.Contains(err.Error(), "targetPrt") {
		t.Fatalf("strict decoding of an unknown field: err = %v, want one naming targetPrt", err)
	}
}
