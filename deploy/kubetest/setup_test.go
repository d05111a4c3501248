//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
)

// The release as docs/deploy.md installs it: release conclave in namespace
// conclave, so its objects are conclave-gateway, conclave-bus, ...
const (
	release   = "conclave"
	namespace = "conclave"
	// agentImage is examples/coven-agent, the agent that registers with
	// the gateway from a pod of its own.
	agentImage = "local/coven-agent:test"
	agentID    = "kubetest-agent"
	// waitLimit bounds each wait for the cluster, only so that a stuck
	// step fails with its diagnosis rather than at go test's timeout.
	waitLimit = 5 * time.Minute
)

// Secrets' contents: the tokens the release's pods take through
// secretKeyRef, as docs/deploy.md's "Install from zero" creates them.
const (
	clientToken = "kubetest-client-token-0123456789abcdef"
	agentToken  = "kubetest-agent-token-0123456789abcdef"
	runnerToken = "kubetest-runner-token-0123456789abcdef"
	busToken    = "kubetest-bus-admin-token-0123456789"
	peerToken   = "kubetest-peer-token-0123456789abcdef"
	hostKey     = "kubetest-host-key-0123456789abcdef-0123456789"
	sessionKey  = "a3ViZXRlc3Qtc2Vzc2lvbi1rZXktMDEyMzQ1Njc4OWE="
)

// chartEnv is a running node with the images imported and the backends
// reachable from its pods, and the release to install on it.
type chartEnv struct {
	rel   *kubeenv.Release
	node  *kubeenv.KubeNodeEnv
	admin kubernetes.Interface
	root  string
	// values is the install's values file.
	values string
	// version is the chart's appVersion, the images' tag.
	version string
}

// setUp builds the images (the gateway's, bus's, runner's and console's
// with conclave-images, as `make images` does, and the example coven
// agent's)
// while the node starts, imports them, serves dynalite and fauxqs to the
// pods, and creates the release's namespace and Secrets.
func setUp(t *testing.T, ctx context.Context) *chartEnv {
	e := &chartEnv{}
	var err error
	if e.root, err = testenv.RepoRoot(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	aws := testenv.StartAWS(t, ctx)
	type built struct {
		tarballs []string
		took     time.Duration
		err      error
	}
	images := make(chan built, 1)
	go func() {
		start := time.Now()
		tarballs, err := buildImages(ctx, dir)
		images <- built{tarballs, time.Since(start), err}
	}()

	start := time.Now()
	e.node, err = kubeenv.KubeNode(ctx)
	if err != nil {
		<-images
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.node.Stop(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("node up in %s", time.Since(start).Round(100*time.Millisecond))
	b := <-images
	if b.err != nil {
		t.Fatal(b.err)
	}
	t.Logf("images built in %s (beside the node's start)", b.took.Round(100*time.Millisecond))
	for _, tarball := range b.tarballs {
		if err := e.node.ImportImage(ctx, tarball); err != nil {
			t.Fatal(err)
		}
	}
	if e.rel, err = kubeenv.NewRelease(ctx, e.node, release, namespace, dir); err != nil {
		t.Fatal(err)
	}
	e.admin = e.rel.Client
	if e.version, err = kubeenv.ChartVersion(); err != nil {
		t.Fatal(err)
	}
	endpoint := serveAWS(t, e.node, aws.Endpoint)
	e.values = filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(e.values, []byte(installValues(endpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	createSecrets(t, ctx, e.rel)
	return e
}

// buildImages builds the gateway, bus, runner and console images with
// conclave-images (deploy/images, as `make images`), with agent-host's and
// the example ACP agent's for the runner's Kubernetes executor, and the
// coven agent's.
func buildImages(ctx context.Context, dir string) ([]string, error) {
	tarballs, err := testenv.ConclaveImages(ctx, dir, "gateway", "bus", "runner", "console", "agent-host", "acp-agent")
	if err != nil {
		return nil, err
	}

	agent := filepath.Join(dir, "coven-agent")
	if err := testenv.BuildStatic(ctx, "./examples/coven-agent", agent); err != nil {
		return nil, err
	}
	tarball := agent + ".tar"
	if err := testenv.WriteImage(tarball, testenv.Image{
		Ref: agentImage, User: "65532:65532", Entrypoint: []string{"/usr/local/bin/coven-agent"},
		Files: []testenv.ImageFile{{Path: "/usr/local/bin/coven-agent", HostPath: agent, Mode: 0o755}},
	}); err != nil {
		return nil, err
	}
	return append(tarballs, tarball), nil
}

// serveAWS answers DynamoDB and SQS at one endpoint inside the node's
// namespace, as CONCLAVE_AWS_ENDPOINT (aws.endpoint) wants (h:
// testenv.AWSEndpoint, dynalite or fauxqs on this host's loopback by
// X-Amz-Target). It returns the endpoint as pods reach it, on KubeNodeIP.
func serveAWS(t *testing.T, node *kubeenv.KubeNodeEnv, h http.Handler) string {
	t.Helper()
	url, err := node.ServeHTTP(h)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// installValues are the install's values: the aws backend on serveAWS's
// endpoint with static test credentials, the images as imported (never
// pulled), the console's service URLs (consoleURLs) and its events bus
// token, and the observability ConfigMaps, so that the release holds
// every kind the chart renders without CRDs or a metrics API. The runner
// is left as the chart has it: the Kubernetes executor (the release makes
// its Role and the agents' ServiceAccount), with the example ACP agent's
// type (its image and agent-host's imported too). Two replicas each, as
// by default.
//
// Two values are left at their defaults because their addresses are
// Service names and the node has no cluster DNS: bus.runnerAgentType
// (the bus dials <release>-runner) and jaeger.enabled (the deployables
// export to <release>-jaeger). For the same reason the console's URLs,
// which default to the Services' names, are replaced (consoleURLs).
func installValues(awsEndpoint string) string {
	return fmt.Sprintf(`backend: aws
tablePrefix: kubetest-
aws:
  region: us-east-1
  endpoint: %q
  credentialsSecret: conclave-aws
image:
  pullPolicy: Never
runner:
  kubernetes:
    imagePullPolicy: Never
observability:
  dashboards:
    enabled: true
  rules:
    enabled: true
`, awsEndpoint) + consoleURLs()
}

// createSecrets makes the namespace and the Secrets the chart names (its
// defaults), as docs/deploy.md's "Install from zero" does.
func createSecrets(t *testing.T, ctx context.Context, rel *kubeenv.Release) {
	t.Helper()
	grants := fmt.Sprintf(`[{"token": %q, "publish": ["*"], "subscribe": ["*"], "admin": true}]`, busToken)
	if err := rel.CreateSecrets(ctx, map[string]map[string]string{
		"conclave-gateway-tokens": {"client-tokens": clientToken, "agent-tokens": agentID + "=" + agentToken},
		"conclave-bus-secrets":    {"grants": grants, "peer-token": peerToken, "runner-token": runnerToken},
		"conclave-runner-tokens":  {"client-tokens": runnerToken, "host-key": hostKey},
		// The console's session key (base64 of 32 bytes, shared by its
		// replicas) and its own bus token, for the Librarian's decisions.
		"conclave-console-secrets": {"session-key": sessionKey, "events-bus-token": busToken},
		// dynalite and fauxqs take any credentials; the SDK wants some.
		"conclave-aws": {"AWS_ACCESS_KEY_ID": "kubetest", "AWS_SECRET_ACCESS_KEY": "kubetest"},
	}); err != nil {
		t.Fatal(err)
	}
}

// helmRun runs helm inside the node's namespace (kubeenv.Release.Helm).
func (e *chartEnv) helmRun(ctx context.Context, args ...string) (string, error) {
	return e.rel.Helm(ctx, args...)
}

func (e *chartEnv) chart() string { return filepath.Join(e.root, "helm", "conclave") }
