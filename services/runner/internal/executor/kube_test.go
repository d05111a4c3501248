package executor

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

// kubeEnv is the package's API server (kube-apiserver and etcd, nothing
// running pods): nil under -short.
var kubeEnv *kubeenv.KubeEnv

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if !shortFlag() {
		// The first build of the binaries takes minutes: no deadline here.
		k, err := kubeenv.Kube(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer k.Stop()
		kubeEnv = k
	}
	return m.Run()
}

// shortFlag reads -short before m.Run parses the flags.
func shortFlag() bool {
	for _, a := range os.Args[1:] {
		if a == "-test.short" || a == "-test.short=true" || a == "--test.short" || a == "--test.short=true" {
			return true
		}
	}
	return false
}

// kubeTest is one test's namespace and executor.
type kubeTest struct {
	// client is an admin's, for what the test does in a controller's or
	// kubelet's stead; runner is the executor's.
	client kubernetes.Interface
	runner kubernetes.Interface
	ns     string
	exec   *Kubernetes
}

func testKubeConfig() KubeConfig {
	return KubeConfig{
		HostImage: "conclave/agent-host:test", ImagePullPolicy: "Never", RunAsNonRoot: true,
		TTLAfterFinish: 10 * time.Minute, StartGrace: time.Hour,
		SecretEnv: []string{"*_AUTH", "*_TOKEN", "*_KEY"},
	}
}

// runnerRoleRules are the rules of the runner's Role in the chart
// (helm/conclave/templates/runner-rbac.yaml, held to the same list by
// helm/chart_deployable_test.go): every test's executor runs as a
// ServiceAccount bound to exactly these, so a call the Role does not allow
// fails the test.
var runnerRoleRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "patch", "delete"}},
}

// newKubeTest makes a namespace and runs an executor on it with cfg
// (its Namespace is filled in), as a ServiceAccount with the runner's Role.
func newKubeTest(t *testing.T, cfg KubeConfig) *kubeTest {
	t.Helper()
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd")
	}
	client, err := kubernetes.NewForConfig(kubeEnv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kexec-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kt := &kubeTest{client: client, ns: ns.Name}
	kt.runner = kt.runnerClient(t)
	kt.exec = kt.runExecutor(t, cfg)
	return kt
}

// runnerClient is a client as the runner's ServiceAccount, once the API
// server's authorizer knows its Role.
func (kt *kubeTest) runnerClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	ctx := t.Context()
	if _, err := kt.client.CoreV1().ServiceAccounts(kt.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kt.client.RbacV1().Roles(kt.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "runner"}, Rules: runnerRoleRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kt.client.RbacV1().RoleBindings(kt.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "runner"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "runner"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "runner", Namespace: kt.ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(kubeEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + kt.ns + ":runner"}
	runner, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of the binding through its own watch.
	testenv.Eventually(t, time.Minute, "the runner's role binding to reach the authorizer", func() bool {
		review, err := runner.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: kt.ns, Verb: "delete", Group: "", Resource: "secrets",
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	})
	return runner
}

// runExecutor starts another executor on the test's namespace, as a
// restarted runner would.
func (kt *kubeTest) runExecutor(t *testing.T, cfg KubeConfig) *Kubernetes {
	t.Helper()
	cfg.Namespace = kt.ns
	exec, err := NewKubernetes(cfg, kt.runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- exec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return exec
}

func (kt *kubeTest) job(t *testing.T, name string) *batchv1.Job {
	t.Helper()
	job, err := kt.client.BatchV1().Jobs(kt.ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func agentSpec(instance string, launch int64) Spec {
	return Spec{
		InstanceID: instance, TaskID: "task-" + instance, Launch: launch,
		Type: agenttype.Type{ID: "acp-agent", Image: "conclave/acp-agent:test", Command: []string{"/acp-agent", "--mode", "acp"}, Enabled: true},
		Env:  map[string]string{"TASK_DESCRIPTION": "fix it"},
		Host: HostSpec{Env: map[string]string{"CONCLAVE_AGENT_HOST_RUNNER": "runner:50052"}, Token: "host-token-secret"},
	}
}

// The executor's ServiceAccount is held to its Role: what it does not need
// is refused, so the suite passing shows the Role is enough.
func TestKubeRunnerRoleDenies(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	ctx := t.Context()
	for what, call := range map[string]func() error{
		"read a secret": func() error {
			_, err := kt.runner.CoreV1().Secrets(kt.ns).Get(ctx, "any", metav1.GetOptions{})
			return err
		},
		"list secrets": func() error {
			_, err := kt.runner.CoreV1().Secrets(kt.ns).List(ctx, metav1.ListOptions{})
			return err
		},
		"create a pod": func() error {
			_, err := kt.runner.CoreV1().Pods(kt.ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		},
		"list jobs in another namespace": func() error {
			_, err := kt.runner.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
			return err
		},
		"update a job": func() error {
			_, err := kt.runner.BatchV1().Jobs(kt.ns).Update(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j"}}, metav1.UpdateOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
}
