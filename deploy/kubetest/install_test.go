//go:build linux

package kubetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// deployables are the release's Deployments, <release>-<name>.
var deployables = []string{"gateway", "bus", "runner", "console"}

// renderedKinds is every kind the install's values render (the chart's
// templates, less the HPA, the dev Jaeger and the PrometheusRule, which
// need a metrics API, cluster DNS and the Prometheus operator's CRDs):
// uninstall must leave none of them.
var renderedKinds = []string{
	"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget",
	"Role", "RoleBinding", "Service", "ServiceAccount",
}

// TestChartOnNode installs helm/conclave on a real node and checks, in
// order: every Deployment's pods become Ready; the gateway, through its
// Service, takes an agent's registration (examples/coven-agent in a pod)
// and a client's message; the console, through its Service, signs in with
// the services' tokens, shows the agent and streams a chat with it; the
// runner's ServiceAccount may do what the Kubernetes executor does (create
// a Job and a Secret, ...) and nothing else; the runner launches the
// example ACP agent as a Job; `helm upgrade` with a changed value rolls
// every Deployment to a new ReplicaSet whose pods become Ready, the
// gateway still serves and the console's session outlives its pods;
// `helm uninstall` leaves none of the release's objects. Last, the dev
// profile, values-dev.yaml, runs on its generated tokens (testDevProfile).
func TestChartOnNode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: installs the chart on a real Kubernetes node")
	}
	begin := time.Now()
	ctx := t.Context()
	e := setUp(t, ctx)
	t.Logf("set up (images, node, backends) in %s", time.Since(begin).Round(100*time.Millisecond))

	steps := []struct {
		name string
		fn   func(*testing.T, *chartEnv)
	}{
		{"Install", testInstall},
		{"GatewayThroughService", testGateway},
		{"ConsoleThroughService", testConsole},
		{"RunnerServiceAccount", testRunnerRBAC},
		{"RunnerLaunchesAgentJob", testRunnerLaunch},
		{"UpgradeRollsPods", testUpgrade},
		{"GatewayAfterUpgrade", testGatewayAfterUpgrade},
		{"ConsoleAfterUpgrade", testConsoleAfterUpgrade},
		{"UninstallLeavesNothing", testUninstall},
		{"DevProfile", testDevProfile},
	}
	for _, s := range steps {
		start := time.Now()
		ok := t.Run(s.name, func(t *testing.T) { s.fn(t, e) })
		t.Logf("%s: %s", s.name, time.Since(start).Round(100*time.Millisecond))
		if !ok {
			t.Logf("diagnosis:\n%s", e.rel.Diagnose())
			break
		}
	}
	t.Logf("the whole test: %s", time.Since(begin).Round(100*time.Millisecond))
}

// testInstall runs `helm install` and waits for each Deployment to have
// all its replicas Ready.
func testInstall(t *testing.T, e *chartEnv) {
	out, err := e.helmRun(t.Context(), "install", release, e.chart(), "--namespace", namespace, "--values", e.values)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install:\n%s", out)
	for _, d := range deployables {
		e.waitRolledOut(t, release+"-"+d, "")
	}
}

// waitRolledOut waits until Deployment name is rolled out
// (kubeenv.Release.WaitRolledOut) on a pod template other than notHash,
// unless notHash is empty, and its Service accepts connections, and returns its pods' pod-template-hash.
func (e *chartEnv) waitRolledOut(t *testing.T, name, notHash string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	hash, err := e.rel.WaitRolledOut(ctx, name, notHash)
	if err == nil {
		err = e.rel.WaitServing(ctx, name)
	}
	if err != nil {
		t.Fatal(err)
	}
	return hash
}

// testGateway runs examples/coven-agent in a pod that dials the gateway's
// Service by the address the kubelet gives pods in its environment
// (<SERVICE>_SERVICE_HOST, no DNS), waits for the gateway to list it, and
// sends it a message from the test through the Service's ClusterIP (so
// the message may reach the replica that does not hold the agent, which
// forwards it).
func testGateway(t *testing.T, e *chartEnv) {
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "coven-agent", Labels: map[string]string{"app": "coven-agent"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "agent", Image: agentImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{
					{Name: "COVEN_AGENT_ADDR", Value: "$(CONCLAVE_GATEWAY_SERVICE_HOST):$(CONCLAVE_GATEWAY_SERVICE_PORT_GRPC)"},
					{Name: "COVEN_AGENT_ID", Value: agentID},
					{Name: "COVEN_AGENT_NAME", Value: "kubetest"},
					{Name: "COVEN_AGENT_TOKEN", Value: agentToken},
					{Name: "COVEN_AGENT_STEP_DELAY", Value: "10ms"},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr(true), AllowPrivilegeEscalation: ptr(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if _, err := e.admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkGateway(t, "hello from kubetest")
}

// checkGateway waits until the gateway lists the agent, then sends it
// content and checks the agent's reply.
func (e *chartEnv) checkGateway(t *testing.T, content string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	svc, err := e.admin.CoreV1().Services(namespace).Get(ctx, release+"-gateway", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "50051")
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return e.node.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := gatewayv1.NewGatewayServiceClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+clientToken)

	// Registered with one of the gateway's current pods (a replica names
	// itself by its host name, the pod's): after an upgrade, not with one
	// that has gone.
	if err := testenv.Poll(waitLimit, func() error { return e.registered(ctx, client) }); err != nil {
		t.Fatalf("the gateway never listed agent %s at a current replica: %v\nthe agent's log:\n%s", agentID, err, e.rel.PodLog("coven-agent", "agent"))
	}

	stream, err := client.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: agentID, Sender: "kubetest", Content: content})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	done := false
	for !done {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SendMessage: %v (text so far %q)", err, text.String())
		}
		ev := resp.GetEvent()
		text.WriteString(ev.GetText())
		if ev.GetError() != "" {
			t.Fatalf("the agent answered an error: %s", ev.GetError())
		}
		done = ev.GetDone() != nil
	}
	if !done {
		t.Fatalf("the reply ended without done (text %q)", text.String())
	}
	// The example agent echoes the message, then tells the time.
	if want := "You said: " + content + "\n"; !strings.HasPrefix(text.String(), want) {
		t.Fatalf("the agent's reply is %q, want it to start with %q", text.String(), want)
	}
}

// registered checks the gateway lists the agent at one of its current pods.
func (e *chartEnv) registered(ctx context.Context, client gatewayv1.GatewayServiceClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := client.GetAgent(cctx, &gatewayv1.GetAgentRequest{AgentId: agentID})
	if err != nil {
		return err
	}
	_, pods, err := e.deploymentPods(ctx, release+"-gateway")
	if err != nil {
		return err
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	if !slices.Contains(names, resp.GetAgent().GetServerId()) {
		return fmt.Errorf("agent listed at %q, the gateway's pods are %v", resp.GetAgent().GetServerId(), names)
	}
	return nil
}

// deploymentPods is the release's Deployment name and its pods.
func (e *chartEnv) deploymentPods(ctx context.Context, name string) (*appsv1.Deployment, []corev1.Pod, error) {
	dep, err := e.admin.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	pods, err := e.rel.Pods(ctx, dep)
	return dep, pods, err
}

// testRunnerRBAC holds the release's runner ServiceAccount to what the
// Kubernetes executor does: SubjectAccessReviews allowed and denied, its
// whole rule set in the release's namespace and in another, and a Job and
// a Secret really created as it (server-side dry run).
func testRunnerRBAC(t *testing.T, e *chartEnv) {
	ctx := t.Context()
	sa := release + "-runner"
	if _, err := e.admin.CoreV1().ServiceAccounts(namespace).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		t.Fatalf("the release's runner ServiceAccount: %v", err)
	}
	for _, tt := range []struct {
		verb, group, resource, subresource, ns string
		allowed                                bool
	}{
		{"create", "batch", "jobs", "", namespace, true},
		{"create", "", "secrets", "", namespace, true},
		{"get", "batch", "jobs", "", namespace, true},
		{"list", "batch", "jobs", "", namespace, true},
		{"watch", "batch", "jobs", "", namespace, true},
		{"delete", "batch", "jobs", "", namespace, true},
		{"list", "", "pods", "", namespace, true},
		{"watch", "", "pods", "", namespace, true},
		{"patch", "", "secrets", "", namespace, true},
		{"delete", "", "secrets", "", namespace, true},

		{"update", "batch", "jobs", "", namespace, false},
		{"patch", "batch", "jobs", "", namespace, false},
		{"create", "batch", "cronjobs", "", namespace, false},
		{"get", "", "secrets", "", namespace, false},
		{"list", "", "secrets", "", namespace, false},
		{"watch", "", "secrets", "", namespace, false},
		{"update", "", "secrets", "", namespace, false},
		{"create", "", "pods", "", namespace, false},
		{"get", "", "pods", "", namespace, false},
		{"delete", "", "pods", "", namespace, false},
		{"create", "", "pods", "exec", namespace, false},
		{"get", "", "pods", "log", namespace, false},
		{"create", "", "configmaps", "", namespace, false},
		{"get", "", "configmaps", "", namespace, false},
		{"create", "", "services", "", namespace, false},
		{"create", "", "serviceaccounts", "token", namespace, false},
		{"update", "apps", "deployments", "", namespace, false},
		{"create", "rbac.authorization.k8s.io", "roles", "", namespace, false},
		{"create", "rbac.authorization.k8s.io", "rolebindings", "", namespace, false},
		{"create", "batch", "jobs", "", "default", false},
		{"create", "", "secrets", "", "default", false},
		{"create", "batch", "jobs", "", "kube-system", false},
		{"list", "batch", "jobs", "", "", false},
		{"list", "", "nodes", "", "", false},
		{"create", "", "namespaces", "", "", false},
	} {
		allowed, err := e.canI(ctx, sa, tt.verb, tt.group, tt.resource, tt.subresource, tt.ns)
		if err != nil {
			t.Fatal(err)
		}
		if allowed != tt.allowed {
			t.Errorf("%s %s/%s/%s in %q: allowed %v, want %v", tt.verb, tt.group, tt.resource, tt.subresource, tt.ns, allowed, tt.allowed)
		}
	}

	// Everything it may do, as the apiserver lists it for the account
	// itself: the Role's rules in the release's namespace, nothing in
	// another. The agents' ServiceAccount may do nothing anywhere, and
	// mounts no token.
	runner := e.clientAs(t, sa)
	for _, tt := range []struct {
		sa, ns string
		want   []string
	}{
		{sa, namespace, []string{"/pods:list,watch", "/secrets:create,delete,patch", "batch/jobs:create,delete,get,list,watch"}},
		{sa, "default", nil},
		{agentAccount, namespace, nil},
		{agentAccount, "default", nil},
	} {
		if got, incomplete := e.rules(t, tt.sa, tt.ns); !slices.Equal(got, tt.want) {
			t.Errorf("in %q %s may %v, want %v (incomplete: %v)", tt.ns, tt.sa, got, tt.want, incomplete)
		}
	}
	agents, err := e.admin.CoreV1().ServiceAccounts(namespace).Get(ctx, agentAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agents' ServiceAccount: %v", err)
	}
	if a := agents.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("the agents' ServiceAccount automounts its token: %v", a)
	}

	// A Job and a Secret created as the runner, checked by admission and
	// authorization but not stored; a ConfigMap is refused.
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: agentImage, ImagePullPolicy: corev1.PullNever}},
		}}},
	}
	if _, err := runner.BatchV1().Jobs(namespace).Create(ctx, job, dryRun); err != nil {
		t.Errorf("the runner cannot create a Job: %v", err)
	}
	if _, err := runner.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}, StringData: map[string]string{"k": "v"},
	}, dryRun); err != nil {
		t.Errorf("the runner cannot create a Secret: %v", err)
	}
	if _, err := runner.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"},
	}, dryRun); !apierrors.IsForbidden(err) {
		t.Errorf("the runner creating a ConfigMap: %v, want Forbidden", err)
	}
	if _, err := runner.CoreV1().Secrets(namespace).Get(ctx, "conclave-runner-tokens", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the runner reading a Secret: %v, want Forbidden", err)
	}
}

// agentAccount is the ServiceAccount the chart makes for the Kubernetes
// executor's agent pods.
const agentAccount = release + "-agents"

// clientAs is a client of the apiserver as the release's ServiceAccount sa.
func (e *chartEnv) clientAs(t *testing.T, sa string) kubernetes.Interface {
	t.Helper()
	as := rest.CopyConfig(e.node.Config)
	as.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	c, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rules is what the release's ServiceAccount sa may do in ns, as the
// apiserver lists it for the account itself (group/resource:verbs,
// sorted), besides what every authenticated user may (ask about its own
// access and identity); and whether the list is incomplete.
func (e *chartEnv) rules(t *testing.T, sa, ns string) ([]string, bool) {
	t.Helper()
	everyone := []string{
		"authentication.k8s.io/selfsubjectreviews:create",
		"authorization.k8s.io/selfsubjectaccessreviews:create",
		"authorization.k8s.io/selfsubjectrulesreviews:create",
	}
	review, err := e.clientAs(t, sa).AuthorizationV1().SelfSubjectRulesReviews().Create(t.Context(), &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range review.Status.ResourceRules {
		verbs := slices.Clone(r.Verbs)
		sort.Strings(verbs)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if rule := g + "/" + res + ":" + strings.Join(verbs, ","); !slices.Contains(everyone, rule) {
					got = append(got, rule)
				}
			}
		}
	}
	sort.Strings(got)
	return got, review.Status.Incomplete
}

// canI asks whether the release's ServiceAccount sa may do verb on
// resource (group/resource[/subresource]) in ns ("" cluster-wide).
func (e *chartEnv) canI(ctx context.Context, sa, verb, group, resource, subresource, ns string) (bool, error) {
	return kubeenv.ServiceAccountCan(ctx, e.admin, namespace, sa, authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: subresource,
	})
}

// testRunnerLaunch launches the example ACP agent, the agent type the
// chart gives the runner by default, through the runner's REST API, at its
// Service, with a client token: the launch crosses SQS (fauxqs), a runner
// replica creates the agent's Job and Secret as its ServiceAccount through
// the kubernetes Service, agent-host in the pod dials back to that
// replica, and the agent's first turn reaches the instance's log. The
// agent's pod runs as the agents' ServiceAccount with no token. Deleting
// the instance removes its Job.
func testRunnerLaunch(t *testing.T, e *chartEnv) {
	e.launchExampleAgent(t, namespace, runnerToken)
}

// launchExampleAgent is testRunnerLaunch's launch, of the release in ns
// with token (one of its runner's client tokens).
func (e *chartEnv) launchExampleAgent(t *testing.T, ns, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	svc, err := e.admin.CoreV1().Services(ns).Get(ctx, release+"-runner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "8082")
	client := &http.Client{Transport: &http.Transport{DialContext: e.node.DialContext, DisableKeepAlives: true}}
	do := func(method, path string, body, out any) (int, error) {
		var rd io.Reader
		if body != nil {
			data, err := json.Marshal(body)
			if err != nil {
				return 0, err
			}
			rd = bytes.NewReader(data)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return resp.StatusCode, err
		}
		if out != nil && resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(data, out); err != nil {
				return resp.StatusCode, fmt.Errorf("%s %s: %w: %s", method, path, err, data)
			}
		}
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, data)
		}
		return resp.StatusCode, nil
	}
	var in struct {
		ID          string `json:"id"`
		ContainerID string `json:"container_id"`
		Status      string `json:"status"`
	}
	if _, err := do("POST", "/api/v1/agents/launch", map[string]any{
		"task_id": "kubetest-task", "agent_type": "acp-agent", "workspace_path": "/workspace/kubetest", "env": map[string]string{"TASK_DESCRIPTION": "from the chart"},
	}, &in); err != nil {
		t.Fatal(err)
	}
	const want = "content: Working on: from the chart"
	var lines struct {
		Lines []struct {
			Text string `json:"text"`
		} `json:"lines"`
	}
	testenv.EventuallyNoError(t, waitLimit, fmt.Sprintf("the agent's turn to reach the log (%q)", want), func() error {
		if _, err := do("GET", "/api/v1/agents/"+in.ID+"/logs?tail=1000", nil, &lines); err != nil {
			t.Fatal(err)
		}
		for _, l := range lines.Lines {
			if l.Text == want {
				return nil
			}
		}
		return fmt.Errorf("the log: %+v", lines.Lines)
	})
	if _, err := do("GET", "/api/v1/agents/"+in.ID+"/status", nil, &in); err != nil {
		t.Fatal(err)
	}
	job, err := e.admin.BatchV1().Jobs(ns).Get(ctx, in.ContainerID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the launch's Job %q: %v", in.ContainerID, err)
	}
	t.Logf("instance %s: %s, Job %s, its pod's init container %s", in.ID, in.Status, job.Name, job.Spec.Template.Spec.InitContainers[0].Image)
	if img := job.Spec.Template.Spec.Containers[0].Image; img != "conclave/acp-agent:"+e.version {
		t.Errorf("the launch's agent runs %s, want the chart's example agent conclave/acp-agent:%s", img, e.version)
	}
	pods, err := e.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "conclave.ai/job=" + job.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the launch's pod: %v, %v", pods, err)
	}
	pod := pods.Items[0].Spec
	if pod.ServiceAccountName != agentAccount {
		t.Errorf("the agent's pod runs as ServiceAccount %q, want %s", pod.ServiceAccountName, agentAccount)
	}
	for _, v := range pod.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				t.Errorf("the agent's pod mounts a ServiceAccount token (volume %s)", v.Name)
			}
		}
	}
	if _, err := do("DELETE", "/api/v1/agents/"+in.ID, nil, nil); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, "the launch's Job "+job.Name, func(ctx context.Context) error {
		_, err := e.admin.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		return err
	})
}

// beforeUpgrade holds each Deployment's pod template hash and pod names
// before the upgrade.
var beforeUpgrade = map[string]struct {
	hash string
	pods []string
}{}

// testUpgrade runs `helm upgrade` with log.level changed (an env var of
// every deployable's pod template) and checks each Deployment rolls: a new
// ReplicaSet, its pods Ready with the new setting, the old ReplicaSet
// scaled to zero, none of the old pods left.
func testUpgrade(t *testing.T, e *chartEnv) {
	ctx := t.Context()
	for _, d := range deployables {
		name := release + "-" + d
		hash, err := e.rel.RolledOut(ctx, name)
		if err != nil {
			t.Fatalf("%s before the upgrade: %v", name, err)
		}
		_, pods, err := e.deploymentPods(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		beforeUpgrade[name] = struct {
			hash string
			pods []string
		}{hash, names}
	}
	out, err := e.helmRun(ctx, "upgrade", release, e.chart(), "--namespace", namespace, "--values", e.values, "--set", "log.level=debug")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade:\n%s", out)
	for _, d := range deployables {
		name := release + "-" + d
		old := beforeUpgrade[name]
		hash := e.waitRolledOut(t, name, old.hash)
		dep, pods, err := e.deploymentPods(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if slices.Contains(old.pods, p.Name) {
				t.Errorf("%s: pod %s from before the upgrade is still there", name, p.Name)
			}
			if v := envValue(p.Spec.Containers[0].Env, "CONCLAVE_LOG_LEVEL"); v != "debug" {
				t.Errorf("%s: pod %s has CONCLAVE_LOG_LEVEL=%q, want the upgrade's debug", name, p.Name, v)
			}
		}
		sets, err := e.admin.AppsV1().ReplicaSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(dep.Spec.Selector)})
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, rs := range sets.Items {
			h := rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
			seen = append(seen, fmt.Sprintf("%s(rev %s, %d/%d)", h, rs.Annotations["deployment.kubernetes.io/revision"], rs.Status.ReadyReplicas, *rs.Spec.Replicas))
			switch h {
			case hash:
				if rs.Status.ReadyReplicas != *dep.Spec.Replicas {
					t.Errorf("%s: the new ReplicaSet %s has %d Ready replicas, want %d", name, rs.Name, rs.Status.ReadyReplicas, *dep.Spec.Replicas)
				}
			case old.hash:
				if *rs.Spec.Replicas != 0 {
					t.Errorf("%s: the old ReplicaSet %s still wants %d replicas", name, rs.Name, *rs.Spec.Replicas)
				}
			}
		}
		t.Logf("%s: pod template %s -> %s; ReplicaSets %v", name, old.hash, hash, seen)
	}
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// testGatewayAfterUpgrade: the agent, whose gateway replica drained during
// the roll, has reconnected through the Service to a new replica, and a
// message reaches it.
func testGatewayAfterUpgrade(t *testing.T, e *chartEnv) {
	e.checkGateway(t, "hello again, after the upgrade")
}

// testUninstall runs `helm uninstall` and checks that every object of the
// release's manifest is gone, none of the chart's kinds is missing from
// that manifest, and nothing labelled with the release remains: pods,
// ReplicaSets, EndpointSlices, helm's release Secrets.
func testUninstall(t *testing.T, e *chartEnv) {
	ctx := t.Context()
	manifest, err := e.helmRun(ctx, "get", "manifest", release, "--namespace", namespace)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := decodeManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objects {
		kinds[o.GetKind()]++
	}
	for _, k := range renderedKinds {
		if kinds[k] == 0 {
			t.Errorf("the release holds no %s: the uninstall check would miss it", k)
		}
	}
	t.Logf("the release's objects by kind: %v", kinds)
	if err := e.admin.CoreV1().Pods(namespace).Delete(ctx, "coven-agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := e.helmRun(ctx, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "5m")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm uninstall:\n%s", out)

	dyn, err := dynamic.NewForConfig(e.node.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(e.admin.Discovery()))
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	for _, o := range objects {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = namespace
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		waitGone(t, ctx, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()), func(ctx context.Context) error {
			_, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
			return err
		})
	}
	// What the release's objects made (pods, ReplicaSets, EndpointSlices)
	// and what helm keeps of it (its release Secrets) go too.
	instance := "app.kubernetes.io/instance=" + release
	for _, leftover := range []struct {
		gvr      schema.GroupVersionResource
		selector string
	}{
		{schema.GroupVersionResource{Version: "v1", Resource: "pods"}, instance},
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, instance},
		{schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}, "kubernetes.io/service-name in (conclave-gateway,conclave-bus,conclave-runner,conclave-console)"},
		{schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, "owner=helm,name=" + release},
		{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, instance},
		{schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, instance},
		{schema.GroupVersionResource{Version: "v1", Resource: "services"}, instance},
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, instance},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, instance},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, instance},
		{schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}, instance},
		{schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"}, instance},
	} {
		waitGone(t, ctx, leftover.gvr.Resource+" with "+leftover.selector, func(ctx context.Context) error {
			list, err := dyn.Resource(leftover.gvr).List(ctx, metav1.ListOptions{LabelSelector: leftover.selector})
			if err != nil {
				return err
			}
			if len(list.Items) == 0 {
				return apierrors.NewNotFound(leftover.gvr.GroupResource(), "")
			}
			var names []string
			for _, it := range list.Items {
				names = append(names, it.GetNamespace()+"/"+it.GetName())
			}
			return fmt.Errorf("left: %v", names)
		})
	}
}

// waitGone waits until get answers NotFound.
func waitGone(t *testing.T, ctx context.Context, what string, get func(context.Context) error) {
	t.Helper()
	for {
		err := get(ctx)
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("%s is still there after the uninstall (%v)", what, err)
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// decodeManifest splits helm's manifest into its objects.
func decodeManifest(manifest string) ([]*unstructured.Unstructured, error) {
	var objects []*unstructured.Unstructured
	for _, doc := range strings.Split(manifest, "\n---") {
		doc = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---"))
		if doc == "" {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("manifest: %w", err)
		}
		if len(m) == 0 {
			continue // only comments
		}
		objects = append(objects, &unstructured.Unstructured{Object: m})
	}
	if len(objects) == 0 {
		return nil, errors.New("the release's manifest is empty")
	}
	return objects, nil
}

func ptr[T any](v T) *T { return &v }
