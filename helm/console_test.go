package helm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// consoleBackends are the release's deployables the console calls, with
// the scheme of the URL it calls each at.
var consoleBackends = map[string]string{"gateway": "http", "bus": "ws", "runner": "http"}

// checkConsole checks the console's Deployment against the rest of the
// render: each service's URL is want's (for the services named there) or
// else the release's Service of it, by its cluster DNS name and http port
// ("" when that deployable is not rendered); the session key comes from
// the Secret; no storage setting or volume; and the NetworkPolicies let
// the console's pods reach the http port of each service it calls. It
// does nothing when the console is not rendered.
func checkConsole(t *testing.T, r rendered, want map[string]string) {
	t.Helper()
	name := release + "-console"
	d, ok := r.deployments[name]
	if !ok {
		return
	}
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for svc, scheme := range consoleBackends {
		key := "CONCLAVE_CONSOLE_" + strings.ToUpper(svc) + "_URL"
		e, ok := env[key]
		if !ok {
			t.Errorf("%s: no %s (the console's default is a loopback address)", name, key)
			continue
		}
		expected, overridden := want[svc]
		if !overridden {
			if s, ok := r.services[release+"-"+svc]; ok {
				expected = fmt.Sprintf("%s://%s.%s.svc:%d", scheme, s.Name, s.Namespace, servicePort(t, s, "http"))
			}
		}
		if e.Value != expected {
			t.Errorf("%s: %s=%q, want %q", name, key, e.Value, expected)
		}
	}
	for _, key := range []string{"CONCLAVE_CONSOLE_LIBRARIAN_URL"} {
		if _, ok := env[key]; !ok {
			t.Errorf("%s: no %s (the console's default is a loopback address)", name, key)
		}
	}
	for key := range env {
		if strings.HasPrefix(key, "AWS_") || slices.Contains([]string{"CONCLAVE_BACKEND", "CONCLAVE_DATA_DIR", "CONCLAVE_TABLE_PREFIX", "CONCLAVE_AWS_ENDPOINT", "POD_IP"}, key) {
			t.Errorf("%s: env %s, but the console keeps no state", name, key)
		}
	}
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name != "tmp" }) {
		t.Errorf("%s: volumes %+v, want only /tmp's", name, spec.Volumes)
	}
	// People sign in (the chart refuses an open console): every replica
	// must seal and open their cookies with one key.
	if key := env["CONCLAVE_CONSOLE_SESSION_KEY"]; key.ValueFrom == nil || key.ValueFrom.SecretKeyRef == nil || key.ValueFrom.SecretKeyRef.Name == "" {
		t.Errorf("%s: the console takes its session key from %+v, want a Secret (replicas must share it)", name, key)
	}

	consoleLabels := d.Spec.Template.Labels
	for svc := range consoleBackends {
		dep, ok := r.deployments[release+"-"+svc]
		if !ok {
			continue
		}
		port := containerPort(t, dep.Spec.Template.Spec.Containers[0], "http")
		if np := r.netpols[release+"-"+svc]; np != nil && !ingressAllows(np, consoleLabels, "conclave", "http", port) {
			t.Errorf("NetworkPolicy %s keeps the console from %s's http port", np.Name, svc)
		}
	}
}

func servicePort(t *testing.T, s *corev1.Service, name string) int32 {
	t.Helper()
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return p.Port
		}
	}
	t.Fatalf("Service %s has no port %s", s.Name, name)
	return 0
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %s", c.Name, name)
	return 0
}

// TestConsole renders the console with its URLs, Service and
// NetworkPolicies varied and checks what each gives: the URLs it calls,
// who may reach it, and whom it may reach.
func TestConsole(t *testing.T) {
	t.Parallel()
	stranger := map[string]string{"app": "stranger"}
	ingressController := map[string]string{"app.kubernetes.io/name": "ingress-nginx"}
	for _, tc := range []struct {
		name string
		set  []string
		urls map[string]string // the URLs the console must call, where not the Services'
		// reach: whether a pod with these labels (in namespace conclave)
		// reaches the console's http port.
		reach    map[string]bool
		affinity corev1.ServiceAffinity
		// strangerReaches: a pod of no deployable reaches the gateway's,
		// bus's and runner's http ports.
		strangerReaches map[string]bool
		disabled        bool
	}{
		{
			name:            "defaults",
			reach:           map[string]bool{"stranger": true},
			affinity:        corev1.ServiceAffinityClientIP,
			strangerReaches: map[string]bool{"gateway": true, "bus": true, "runner": false},
		},
		{
			name: "every policy closed",
			set: []string{
				"gateway.networkPolicy.allowExternal=false", "bus.networkPolicy.allowExternal=false",
				"console.networkPolicy.allowExternal=false", "console.service.sessionAffinity=None",
			},
			reach:           map[string]bool{"stranger": false, "ingress": false},
			affinity:        corev1.ServiceAffinityNone,
			strangerReaches: map[string]bool{"gateway": false, "bus": false, "runner": false},
		},
		{
			name: "behind an ingress controller",
			set: []string{
				"console.networkPolicy.allowExternal=false",
				"console.networkPolicy.from[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=ingress-nginx",
			},
			reach:           map[string]bool{"stranger": false, "ingress": true},
			affinity:        corev1.ServiceAffinityClientIP,
			strangerReaches: map[string]bool{"gateway": true, "bus": true, "runner": false},
		},
		{
			name: "services elsewhere",
			set: []string{
				"gateway.enabled=false", "runner.enabled=false", "jaeger.enabled=true",
				"console.urls.gateway=https://gateway.example.com", "console.urls.librarian=https://librarian.example.com/",
				"console.urls.jaeger=https://jaeger.example.com",
			},
			urls:            map[string]string{"gateway": "https://gateway.example.com", "runner": ""},
			reach:           map[string]bool{"stranger": true},
			affinity:        corev1.ServiceAffinityClientIP,
			strangerReaches: map[string]bool{"bus": true},
		},
		{
			name:            "console disabled",
			set:             []string{"console.enabled=false"},
			disabled:        true,
			strangerReaches: map[string]bool{"gateway": true, "bus": true, "runner": false},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := index(t, render(t, nil, tc.set...))
			for _, d := range deployables {
				if _, ok := r.deployments[release+"-"+d]; ok {
					checkDeployable(t, r, d)
				}
			}
			name := release + "-console"
			// The console's labels, as its pods would have them even when
			// it is not rendered: no policy may let them in then.
			consoleLabels := map[string]string{"app.kubernetes.io/name": "conclave", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "console"}
			for svc, want := range tc.strangerReaches {
				np := r.netpols[release+"-"+svc]
				port := containerPort(t, r.deployments[release+"-"+svc].Spec.Template.Spec.Containers[0], "http")
				if got := ingressAllows(np, stranger, "conclave", "http", port); got != want {
					t.Errorf("a stranger pod reaches the %s: %v, want %v", svc, got, want)
				}
				if tc.disabled && !want && ingressAllows(np, consoleLabels, "conclave", "http", port) {
					t.Errorf("with the console disabled, NetworkPolicy %s still lets console pods in", np.Name)
				}
			}
			if tc.disabled {
				for kind, names := range map[string][]string{
					"Deployment": keys(r.deployments), "Service": keys(r.services), "ServiceAccount": keys(r.serviceAccounts),
					"PodDisruptionBudget": keys(r.pdbs), "NetworkPolicy": keys(r.netpols),
				} {
					if slices.Contains(names, name) {
						t.Errorf("console.enabled=false still renders %s %s", kind, name)
					}
				}
				return
			}
			checkConsole(t, r, tc.urls)
			if _, ok := r.deployments[name]; !ok {
				t.Fatalf("no Deployment %s", name)
			}
			env := envOf(r.deployments[name])
			for _, key := range []string{"librarian", "jaeger"} {
				flag := "console.urls." + key + "="
				i := slices.IndexFunc(tc.set, func(s string) bool { return strings.HasPrefix(s, flag) })
				want := ""
				if i >= 0 {
					want = strings.TrimPrefix(tc.set[i], flag)
				}
				if got := env["CONCLAVE_CONSOLE_"+strings.ToUpper(key)+"_URL"]; got != want {
					t.Errorf("CONCLAVE_CONSOLE_%s_URL=%q, want %q", strings.ToUpper(key), got, want)
				}
			}
			if svc := r.services[name]; svc.Spec.SessionAffinity != tc.affinity {
				t.Errorf("Service %s: sessionAffinity %q, want %q", name, svc.Spec.SessionAffinity, tc.affinity)
			}
			np := r.netpols[name]
			for who, want := range tc.reach {
				labels := map[string]map[string]string{"stranger": stranger, "ingress": ingressController}[who]
				if got := ingressAllows(np, labels, "conclave", "http", 8090); got != want {
					t.Errorf("a %s pod reaches the console: %v, want %v", who, got, want)
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
