package kubeenv_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
)

// TestKube starts a real kube-apiserver and etcd, creates a batch/v1 Job the
// way the runner's Kubernetes executor does, and reads it back.
func TestKube(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd")
	}
	t.Parallel()
	// Not under the deadline below: on a fresh clone Kube builds the
	// binaries first, which takes minutes.
	k, err := kubeenv.Kube(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v\n%s", err, k.Output())
	}
	if v.Major != "1" || v.Minor != "34" {
		t.Errorf("server version = %s (major %q, minor %q), want 1.34", v.GitVersion, v.Major, v.Minor)
	}

	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "testenv-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	backoff := int32(2)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "agent-run",
			Labels: map[string]string{"app.kubernetes.io/managed-by": "conclave-runner"},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit: &backoff,
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name:    "agent",
						Image:   "example.invalid/agent:1",
						Command: []string{"/agent", "--acp"},
						Env:     []corev1.EnvVar{{Name: "TASK_ID", Value: "t-1"}},
					}},
				},
			},
		},
	}
	created, err := cs.BatchV1().Jobs(ns.Name).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create job: %v", err)
	}
	if created.UID == "" {
		t.Error("created job has no UID")
	}

	got, err := cs.BatchV1().Jobs(ns.Name).Get(ctx, "agent-run", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get job: %v", err)
	}
	if got.UID != created.UID {
		t.Errorf("UID = %s, want %s", got.UID, created.UID)
	}
	if got.Labels["app.kubernetes.io/managed-by"] != "conclave-runner" {
		t.Errorf("labels = %v", got.Labels)
	}
	if got.Spec.BackoffLimit == nil || *got.Spec.BackoffLimit != 2 {
		t.Errorf("backoffLimit = %v, want 2", got.Spec.BackoffLimit)
	}
	cs0 := got.Spec.Template.Spec.Containers
	if len(cs0) != 1 || cs0[0].Image != "example.invalid/agent:1" || len(cs0[0].Command) != 2 ||
		len(cs0[0].Env) != 1 || cs0[0].Env[0].Value != "t-1" {
		t.Errorf("containers = %+v", cs0)
	}
	if got.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy = %s", got.Spec.Template.Spec.RestartPolicy)
	}
	// The API server's defaulting ran: a real server, not a store of bytes.
	if got.Spec.Completions == nil || *got.Spec.Completions != 1 || got.Spec.CompletionMode == nil ||
		*got.Spec.CompletionMode != batchv1.NonIndexedCompletion {
		t.Errorf("defaults not applied: completions %v, completionMode %v", got.Spec.Completions, got.Spec.CompletionMode)
	}

	list, err := cs.BatchV1().Jobs(ns.Name).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=conclave-runner"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "agent-run" {
		t.Errorf("list by label = %d jobs", len(list.Items))
	}

	// The kubeconfig file serves command line clients: helm reaches the
	// server through it.
	helm, err := kubeenv.Helm(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, helm, "list", "--all-namespaces", "--kubeconfig", k.Kubeconfig)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "NAME") {
		t.Errorf("helm list: %v\n%s", err, out)
	}
}
