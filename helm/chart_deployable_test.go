package helm

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// podEnvHelpers are env vars the chart sets that are no Conclave setting:
// POD_IP only other values expand; the AWS SDK reads the static credentials
// of aws.credentialsSecret.
var podEnvHelpers = []string{"POD_IP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

// secretSettings must come from a Secret, never a literal value.
var secretSettings = regexp.MustCompile(`_(CLIENT_TOKENS|AGENT_TOKENS|ADMIN_TOKENS|LIBRARIAN_TOKENS|GRANTS|PEER_TOKEN|RUNNER_TOKEN|HOST_KEY|SESSION_KEY|BUS_TOKEN|GATEWAY_TOKEN)$|^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY)$`)

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
