//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The dev profile's release: values-dev.yaml, in a namespace of its own,
// with the Secret the chart makes (devSecrets.generate).
const (
	devNamespace = "conclave-dev"
	devSecret    = release + "-dev-secrets"
)

// devNodeValues go over values-dev.yaml on the node: the images as
// imported (never pulled), no dev Jaeger (its image is not on the node,
// and the node has no DNS for its Service name) and the console's
// service URLs by the kubelet's Service variables (consoleURLs). The
// rest, tokens included, is the profile's.
func devNodeValues() string {
	return fmt.Sprintf(`image:
  pullPolicy: Never
runner:
  kubernetes:
    imagePullPolicy: Never
jaeger:
  enabled: false
console:
  urls:
    gateway: "http://$(%[1]s_GATEWAY_SERVICE_HOST):$(%[1]s_GATEWAY_SERVICE_PORT_HTTP)"
    bus: "ws://$(%[1]s_BUS_SERVICE_HOST):$(%[1]s_BUS_SERVICE_PORT_HTTP)"
    runner: "http://$(%[1]s_RUNNER_SERVICE_HOST):$(%[1]s_RUNNER_SERVICE_PORT_HTTP)"
`, strings.ToUpper(release))
}

// testDevProfile installs helm/conclave/values-dev.yaml, as `helm install
// -f values-dev.yaml` and `skaffold dev -p dev` do, without making any
// Secret: every Deployment must become Ready, so each service started
// with the tokens of the Secret the chart made (a service without them
// refuses a pod's address). People's dev-token signs in to the console
// for the gateway, bus and runner, whose panels answer, and launches the
// example agent as a Job through the runner (agent-host's token signed
// with the generated host key). `helm upgrade` keeps the Secret's values
// (lookup): after the roll the session and the token still work. `helm
// uninstall` removes the Secret.
func testDevProfile(t *testing.T, e *chartEnv) {
	ctx := t.Context()
	rel := *e.rel
	rel.Namespace = devNamespace
	values := filepath.Join(t.TempDir(), "dev-node.yaml")
	if err := os.WriteFile(values, []byte(devNodeValues()), 0o600); err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) {
		t.Helper()
		args = append(args, "--namespace", devNamespace, "--values", filepath.Join(e.chart(), "values-dev.yaml"), "--values", values)
		out, err := e.helmRun(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm %s:\n%s", args[0], out)
	}
	waitAll := func(notHash map[string]string) map[string]string {
		t.Helper()
		hashes := map[string]string{}
		for _, d := range deployables {
			wctx, cancel := context.WithTimeout(ctx, waitLimit)
			hash, err := rel.WaitRolledOut(wctx, release+"-"+d, notHash[d])
			if err == nil {
				err = rel.WaitServing(wctx, release+"-"+d)
			}
			cancel()
			if err != nil {
				t.Fatalf("%v\ndiagnosis:\n%s", err, rel.Diagnose())
			}
			hashes[d] = hash
		}
		return hashes
	}
	readSecret := func() map[string]string {
		t.Helper()
		s, err := e.admin.CoreV1().Secrets(devNamespace).Get(ctx, devSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Secret the chart makes: %v", err)
		}
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		return data
	}

	helm("install", release, e.chart(), "--create-namespace")
	hashes := waitAll(nil)
	secret := readSecret()
	token := secret["dev-token"]
	if len(token) < 32 {
		t.Fatalf("the Secret's dev-token is %d characters, want 32 (keys %v)", len(token), slices.Sorted(maps.Keys(secret)))
	}

	s := e.signInDev(t, token)
	e.launchExampleAgent(t, devNamespace, token)

	// An upgrade that rolls every pod: the Secret's values stay (the
	// chart reads them back), so the new pods take the same tokens and
	// session key.
	helm("upgrade", release, e.chart(), "--set", "log.level=debug")
	waitAll(hashes)
	if after := readSecret(); !maps.Equal(after, secret) {
		var changed []string
		for k := range secret {
			if after[k] != secret[k] {
				changed = append(changed, k)
			}
		}
		t.Errorf("helm upgrade changed the Secret's %v", changed)
	}
	actx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	status, path, body, err := s.get(actx, "/")
	if err != nil || status != http.StatusOK || path != "/" {
		t.Fatalf("the session from before the upgrade: %d at %s (%v), want the overview:\n%.2000s", status, path, err, body)
	}
	checkDevOverview(t, body)
	e.signInDev(t, token)

	out, err := e.helmRun(ctx, "uninstall", release, "--namespace", devNamespace, "--wait", "--timeout", "5m")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm uninstall:\n%s", out)
	waitGone(t, actx, "Secret "+devSecret, func(ctx context.Context) error {
		_, err := e.admin.CoreV1().Secrets(devNamespace).Get(ctx, devSecret, metav1.GetOptions{})
		return err
	})
	if err := e.admin.CoreV1().Namespaces().Delete(ctx, devNamespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
}

// signInDev signs in to the dev release's console through its Service
// with token as the gateway's, the bus's and the runner's, and checks the
// overview it lands on.
func (e *chartEnv) signInDev(t *testing.T, token string) *consoleSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	s := e.consoleSession(t, ctx, devNamespace)
	status, path, body, err := s.get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	m := signinCSRF.FindStringSubmatch(body)
	if status != http.StatusOK || path != "/signin" || m == nil {
		t.Fatalf("GET / without a session: %d at %s, want the sign-in form:\n%.2000s", status, path, body)
	}
	status, path, body, err = s.postForm(ctx, "/signin", url.Values{
		"signin_csrf": {m[1]}, "next": {"/"},
		"gateway_token": {token}, "bus_token": {token}, "runner_token": {token},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || path != "/" {
		t.Fatalf("sign-in with dev-token: %d at %s, want the overview:\n%.3000s", status, path, body)
	}
	checkDevOverview(t, body)
	return s
}

// checkDevOverview checks the dev release's overview: the gateway, bus
// and runner panels answer (the console reached each with the session's
// token); only the Librarian's, not on the node, shows its banner.
func checkDevOverview(t *testing.T, body string) {
	t.Helper()
	var banners []string
	for _, m := range banner.FindAllStringSubmatch(body, -1) {
		banners = append(banners, m[1])
	}
	if strings.Join(banners, ",") != "librarian" {
		t.Errorf("the overview's banners are %v, want only the Librarian's:\n%.4000s", banners, body)
	}
}
