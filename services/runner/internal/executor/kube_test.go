package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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
// helm/chart_test.go): every test's executor runs as a ServiceAccount
// bound to exactly these, so a call the Role does not allow fails the test.
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

// The Job and Secret of a launch, field by field.
func TestKubeJobSpec(t *testing.T) {
	t.Parallel()
	cfg := testKubeConfig()
	cfg.WorkspaceClaim, cfg.WorkspaceRoot = "workspaces", "/srv/workspaces"
	kt := newKubeTest(t, cfg)
	emptyDir := kt.runExecutor(t, testKubeConfig())
	gwCfg := testKubeConfig()
	gwCfg.GatewayTokenSecret, gwCfg.GatewayTokenKey = "operator-gateway", "agent-token"
	withGateway := kt.runExecutor(t, gwCfg)

	longID := strings.Repeat("Instance/ID with spaces and UPPER case ", 4)
	for _, tt := range []struct {
		name  string
		exec  *Kubernetes
		spec  func(Spec) Spec
		check func(t *testing.T, job *batchv1.Job, secret *corev1.Secret)
	}{
		{
			name: "resources, deadline, backoff, ttl",
			spec: func(s Spec) Spec {
				s.Type.MemoryMB, s.Type.CPUCores, s.Type.Timeout = 2048, 1.5, 90*time.Second+time.Millisecond
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, _ *corev1.Secret) {
				c := job.Spec.Template.Spec.Containers[0]
				for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
					if m := list[corev1.ResourceMemory]; m.Cmp(resource.MustParse("2Gi")) != 0 {
						t.Errorf("memory %s, want 2Gi", m.String())
					}
					if cpu := list[corev1.ResourceCPU]; cpu.Cmp(resource.MustParse("1500m")) != 0 {
						t.Errorf("cpu %s, want 1500m", cpu.String())
					}
				}
				if d := job.Spec.ActiveDeadlineSeconds; d == nil || *d != 91 {
					t.Errorf("activeDeadlineSeconds %v, want 91 (the timeout rounded up)", d)
				}
				if b := job.Spec.BackoffLimit; b == nil || *b != 0 {
					t.Errorf("backoffLimit %v, want 0", b)
				}
				if ttl := job.Spec.TTLSecondsAfterFinished; ttl == nil || *ttl != 600 {
					t.Errorf("ttlSecondsAfterFinished %v, want 600", ttl)
				}
				if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
					t.Errorf("restartPolicy %s", job.Spec.Template.Spec.RestartPolicy)
				}
			},
		},
		{
			name: "no resources when zero, default timeout",
			check: func(t *testing.T, job *batchv1.Job, _ *corev1.Secret) {
				for _, c := range append(job.Spec.Template.Spec.InitContainers, job.Spec.Template.Spec.Containers...) {
					if len(c.Resources.Requests)+len(c.Resources.Limits) != 0 {
						t.Errorf("%s: resources %+v, want none", c.Name, c.Resources)
					}
				}
				if d := job.Spec.ActiveDeadlineSeconds; d == nil || *d != int64(agenttype.DefaultTimeout.Seconds()) {
					t.Errorf("activeDeadlineSeconds %v, want the default timeout", d)
				}
			},
		},
		{
			name: "containers, agent-host install, hardening",
			check: func(t *testing.T, job *batchv1.Job, _ *corev1.Secret) {
				pod := job.Spec.Template.Spec
				if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
					t.Fatalf("containers %d + init %d", len(pod.Containers), len(pod.InitContainers))
				}
				init, agent := pod.InitContainers[0], pod.Containers[0]
				if init.Image != "conclave/agent-host:test" || strings.Join(init.Command, " ") != "/usr/local/bin/agent-host install /conclave/bin/agent-host" {
					t.Errorf("init container %s %v", init.Image, init.Command)
				}
				if agent.Name != "agent" || agent.Image != "conclave/acp-agent:test" ||
					strings.Join(agent.Command, " ") != "/conclave/bin/agent-host -- /acp-agent --mode acp" || agent.WorkingDir != "/workspace" {
					t.Errorf("agent container %s %s %v in %s", agent.Name, agent.Image, agent.Command, agent.WorkingDir)
				}
				for _, c := range []corev1.Container{init, agent} {
					sc := c.SecurityContext
					if c.ImagePullPolicy != corev1.PullNever || sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
						sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
						t.Errorf("%s: pull %s, security %+v", c.Name, c.ImagePullPolicy, sc)
					}
				}
				if init.SecurityContext.ReadOnlyRootFilesystem == nil || !*init.SecurityContext.ReadOnlyRootFilesystem {
					t.Error("the init container's root filesystem is writable")
				}
				psc := pod.SecurityContext
				if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("pod security %+v", psc)
				}
				if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
					t.Error("the pod mounts a service account token or gets service links")
				}
				if init.VolumeMounts[0].Name != agent.VolumeMounts[0].Name || pod.Volumes[0].EmptyDir == nil || !agent.VolumeMounts[0].ReadOnly {
					t.Errorf("agent-host is not shared through an emptyDir: %+v %+v %+v", init.VolumeMounts, agent.VolumeMounts, pod.Volumes)
				}
			},
		},
		{
			name: "labels and annotations of awkward ids",
			spec: func(s Spec) Spec {
				s.InstanceID, s.TaskID = longID, "task:"+longID
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, secret *corev1.Secret) {
				if errs := validation.IsDNS1123Label(job.Name); len(errs) > 0 {
					t.Errorf("job name %q: %v", job.Name, errs)
				}
				want := map[string]string{
					LabelManagedBy: ManagedByRunner, LabelInstance: labelValue(longID), LabelTask: labelValue("task:" + longID),
					LabelAgentType: "acp-agent", LabelLaunch: "1",
				}
				for _, l := range []map[string]string{job.Labels, job.Spec.Template.Labels, secret.Labels} {
					for k, v := range want {
						if l[k] != v {
							t.Errorf("label %s = %q, want %q", k, l[k], v)
						}
					}
				}
				if job.Spec.Template.Labels[LabelJob] != job.Name {
					t.Errorf("pod template label %s = %q", LabelJob, job.Spec.Template.Labels[LabelJob])
				}
				if job.Annotations[AnnotationInstance] != longID || job.Annotations[AnnotationTask] != "task:"+longID {
					t.Errorf("annotations %v", job.Annotations)
				}
			},
		},
		{
			// agent-host registers the agent at the gateway with the
			// operator's Secret's token, referenced, never copied; the
			// agent's env (only a type's can hold such names) cannot
			// point agent-host elsewhere or give it another token.
			name: "gateway token from the operator's Secret",
			exec: withGateway,
			spec: func(s Spec) Spec {
				s.Host.Env["CONCLAVE_AGENT_HOST_GATEWAY_ADDR"] = "conclave-gateway:50051"
				s.Type.Env = map[string]string{"CONCLAVE_AGENT_HOST_GATEWAY_TOKEN": "a type's own token", "CONCLAVE_AGENT_HOST_RUNNER": "elsewhere:1"}
				maps.Copy(s.Env, s.Type.Env)
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, secret *corev1.Secret) {
				var ref *corev1.SecretKeySelector
				n := 0
				for _, e := range job.Spec.Template.Spec.Containers[0].Env {
					switch e.Name {
					case "CONCLAVE_AGENT_HOST_GATEWAY_TOKEN":
						n++
						if e.ValueFrom != nil {
							ref = e.ValueFrom.SecretKeyRef
						}
					case "CONCLAVE_AGENT_HOST_RUNNER":
						if e.Value != "runner:50052" {
							t.Errorf("CONCLAVE_AGENT_HOST_RUNNER = %q, want the runner's", e.Value)
						}
					}
				}
				if n != 1 || ref == nil || ref.Name != "operator-gateway" || ref.Key != "agent-token" {
					t.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_TOKEN: %d of it, ref %+v; want one secretKeyRef to operator-gateway/agent-token", n, ref)
				}
				if _, ok := secret.Data["CONCLAVE_AGENT_HOST_GATEWAY_TOKEN"]; ok {
					t.Error("the launch's Secret holds a gateway token")
				}
			},
		},
		{
			name: "secret env by secretKeyRef, values only in the Secret",
			spec: func(s Spec) Spec {
				s.Type.LaunchEnv = []string{"AUGMENT_SESSION_AUTH", "OPENAI_*"}
				s.Env["AUGMENT_SESSION_AUTH"] = "auth-secret-value"
				s.Env["OPENAI_API_KEY"] = "key-secret-value"
				// Only the type's own env can hold a CONCLAVE_ name.
				s.Type.Env = map[string]string{"CONCLAVE_AGENT_HOST_TOKEN": "the type's own value never wins over the host's"}
				s.Env["CONCLAVE_AGENT_HOST_TOKEN"] = s.Type.Env["CONCLAVE_AGENT_HOST_TOKEN"]
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, secret *corev1.Secret) {
				spec, _ := json.Marshal(job)
				for _, v := range []string{"auth-secret-value", "key-secret-value", "host-token-secret"} {
					if strings.Contains(string(spec), v) {
						t.Errorf("the Job spec holds the secret value %q", v)
					}
				}
				inline := map[string]string{}
				refs := map[string]string{}
				for _, e := range job.Spec.Template.Spec.Containers[0].Env {
					if e.ValueFrom != nil {
						refs[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
					} else {
						inline[e.Name] = e.Value
					}
				}
				if inline["TASK_DESCRIPTION"] != "fix it" || inline["CONCLAVE_AGENT_HOST_RUNNER"] != "runner:50052" ||
					inline["CONCLAVE_AGENT_HOST_WORKSPACE"] != "/workspace" || len(inline) != 5 {
					t.Errorf("inline env %v", inline)
				}
				// What agent-host checks again before it starts the agent.
				if got, want := inline["CONCLAVE_AGENT_HOST_LAUNCH_ENV"], "AUGMENT_SESSION_AUTH,OPENAI_API_KEY,TASK_DESCRIPTION"; got != want {
					t.Errorf("CONCLAVE_AGENT_HOST_LAUNCH_ENV = %q, want %q", got, want)
				}
				if got, want := inline["CONCLAVE_AGENT_HOST_LAUNCH_ENV_ALLOWED"], "TASK_DESCRIPTION,AUGGIE_SESSION_ID,AUGMENT_SESSION_AUTH,OPENAI_*"; got != want {
					t.Errorf("CONCLAVE_AGENT_HOST_LAUNCH_ENV_ALLOWED = %q, want %q", got, want)
				}
				for _, n := range []string{"AUGMENT_SESSION_AUTH", "OPENAI_API_KEY", "CONCLAVE_AGENT_HOST_TOKEN"} {
					if refs[n] != job.Name+"/"+n {
						t.Errorf("%s is %q, want a secretKeyRef to %s/%s", n, refs[n], job.Name, n)
					}
				}
				want := map[string]string{"AUGMENT_SESSION_AUTH": "auth-secret-value", "OPENAI_API_KEY": "key-secret-value", "CONCLAVE_AGENT_HOST_TOKEN": "host-token-secret"}
				if len(secret.Data) != len(want) {
					t.Errorf("secret keys %d, want %d", len(secret.Data), len(want))
				}
				for k, v := range want {
					if string(secret.Data[k]) != v {
						t.Errorf("secret %s = %q, want %q", k, secret.Data[k], v)
					}
				}
				if secret.Immutable == nil || !*secret.Immutable {
					t.Error("the Secret is mutable")
				}
			},
		},
		{
			name: "workspace claim with the workspace's subPath, working_dir",
			spec: func(s Spec) Spec {
				s.Workspace = "/srv/workspaces/team/repo"
				s.Type.WorkingDir = "/src/"
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, _ *corev1.Secret) {
				pod := job.Spec.Template.Spec
				agent := pod.Containers[0]
				ws := agent.VolumeMounts[1]
				if ws.MountPath != "/src" || ws.SubPath != "team/repo" || agent.WorkingDir != "/src" {
					t.Errorf("workspace mount %+v in %s", ws, agent.WorkingDir)
				}
				if v := pod.Volumes[1]; v.Name != ws.Name || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "workspaces" {
					t.Errorf("workspace volume %+v", v)
				}
			},
		},
		{
			name: "throwaway workspace",
			exec: emptyDir,
			spec: func(s Spec) Spec {
				s.Workspace = "/anywhere/the/runner/sees"
				return s
			},
			check: func(t *testing.T, job *batchv1.Job, _ *corev1.Secret) {
				pod := job.Spec.Template.Spec
				if ws := pod.Containers[0].VolumeMounts[1]; ws.MountPath != "/workspace" || ws.SubPath != "" || pod.Volumes[1].EmptyDir == nil {
					t.Errorf("workspace %+v %+v", ws, pod.Volumes[1])
				}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := agentSpec(jobName(tt.name, 0), 1)
			spec.Workspace = "/srv/workspaces"
			if tt.spec != nil {
				spec = tt.spec(spec)
			}
			exec := tt.exec
			if exec == nil {
				exec = kt.exec
			}
			p, err := exec.Start(t.Context(), spec, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			job := kt.job(t, p.ID())
			secret, err := kt.client.CoreV1().Secrets(kt.ns).Get(t.Context(), job.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			refs := secret.OwnerReferences
			if len(refs) != 1 || refs[0].Kind != "Job" || refs[0].APIVersion != "batch/v1" || refs[0].Name != job.Name || refs[0].UID != job.UID {
				t.Errorf("secret owners %+v, want the Job %s (%s)", refs, job.Name, job.UID)
			}
			tt.check(t, job, secret)
		})
	}
}

func TestKubeStartRefuses(t *testing.T) {
	t.Parallel()
	cfg := testKubeConfig()
	cfg.WorkspaceClaim, cfg.WorkspaceRoot = "workspaces", "/srv/workspaces"
	kt := newKubeTest(t, cfg)
	for _, tt := range []struct {
		name string
		spec func(Spec) Spec
		want string
	}{
		{"no image", func(s Spec) Spec { s.Type.Image = ""; return s }, "no image"},
		{"no launch number", func(s Spec) Spec { s.Launch = 0; return s }, "launch number"},
		{"no command", func(s Spec) Spec { s.Type.Command = nil; return s }, "no command"},
		{"workspace outside the claim", func(s Spec) Spec { s.Workspace = "/srv/other"; return s }, "not within"},
		{"working_dir over agent-host", func(s Spec) Spec { s.Type.WorkingDir = "/conclave/bin"; return s }, "working_dir"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec(agentSpec("refused", 1))
			if spec.Workspace == "" {
				spec.Workspace = "/srv/workspaces/x"
			}
			_, err := kt.exec.Start(t.Context(), spec, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start: %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	jobs, err := kt.client.BatchV1().Jobs(kt.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(jobs.Items) != 0 {
		t.Errorf("refused launches left jobs: %v %v", jobs, err)
	}
	secrets, err := kt.client.CoreV1().Secrets(kt.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("refused launches left secrets: %v %v", secrets, err)
	}
}

// A Job that cannot be created leaves no Secret behind.
func TestKubeJobCreateFailureDeletesSecret(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	spec := agentSpec("refused-by-the-server", 1)
	// The API validates launches' env names, and the registry its types';
	// the API server still refuses this one.
	spec.Type.Env = map[string]string{"NOT=A NAME": "x"}
	spec.Env["NOT=A NAME"] = "x"
	_, err := kt.exec.Start(t.Context(), spec, io.Discard)
	if err == nil || !apierrors.IsInvalid(err) {
		t.Fatalf("Start: %v, want the API server's Invalid", err)
	}
	_, err = kt.client.CoreV1().Secrets(kt.ns).Get(t.Context(), jobName(spec.InstanceID, 1), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the Secret of the Job not created: %v, want it deleted", err)
	}
}

// Kill deletes the Job with foreground propagation and the Secret; Wait
// returns once the Job is gone; Kill again is harmless.
func TestKubeKill(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	p, err := kt.exec.Start(t.Context(), agentSpec("killed", 2), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := kt.client.CoreV1().Secrets(kt.ns).Get(t.Context(), p.ID(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after Kill: %v, want not found", err)
	}
	// No garbage collector runs here: the Job waits, as on a real cluster
	// until its pods are gone, with the foreground finalizer. Do what the
	// collector would.
	job := kt.job(t, p.ID())
	if job.DeletionTimestamp == nil || len(job.Finalizers) != 1 || job.Finalizers[0] != metav1.FinalizerDeleteDependents {
		t.Fatalf("job after Kill: deletion %v, finalizers %v; want a foreground deletion", job.DeletionTimestamp, job.Finalizers)
	}
	select {
	case <-testenv.As[*kubeProcess](t, p, "the process").done:
		t.Fatal("Wait returned before the Job was gone")
	default:
	}
	job.Finalizers = nil
	if _, err := kt.client.BatchV1().Jobs(kt.ns).Update(t.Context(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); !errors.Is(err, ErrJobDeleted) {
		t.Errorf("Wait: %v, want ErrJobDeleted", err)
	}
	if _, err := kt.client.BatchV1().Jobs(kt.ns).Get(t.Context(), p.ID(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("job after Kill: %v, want not found", err)
	}
	if err := p.Kill(); err != nil {
		t.Errorf("a second Kill: %v", err)
	}
}

// A restarted runner adopts a running launch's Job, and gets a finished
// one's result at once.
func TestKubeAdoption(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	running, err := kt.exec.Start(t.Context(), agentSpec("adopted", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	before := kt.job(t, running.ID())

	restarted := kt.runExecutor(t, testKubeConfig())
	again, err := restarted.Start(t.Context(), agentSpec("adopted", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != running.ID() || kt.job(t, again.ID()).UID != before.UID {
		t.Errorf("adopted %s, want the existing %s (%s)", again.ID(), running.ID(), before.UID)
	}
	jobs, _ := kt.client.BatchV1().Jobs(kt.ns).List(t.Context(), metav1.ListOptions{})
	if len(jobs.Items) != 1 {
		t.Errorf("%d jobs after adoption, want 1", len(jobs.Items))
	}

	// Another instance's Job under the same name is refused, not adopted.
	job := kt.job(t, before.Name)
	job.Annotations[AnnotationInstance] = "someone-else"
	if _, err := kt.client.BatchV1().Jobs(kt.ns).Update(t.Context(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kt.runExecutor(t, testKubeConfig()).Start(t.Context(), agentSpec("adopted", 1), io.Discard); err == nil || !strings.Contains(err.Error(), "someone-else") {
		t.Errorf("Start over another instance's job: %v", err)
	}
	job = kt.job(t, before.Name)
	job.Annotations[AnnotationInstance] = "adopted"
	if _, err := kt.client.BatchV1().Jobs(kt.ns).Update(t.Context(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kt.setJobCondition(t, before.Name, batchv1.JobComplete, "")

	// Finished before the runner came back: Wait returns its result.
	finished, err := kt.runExecutor(t, testKubeConfig()).Start(t.Context(), agentSpec("adopted", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := finished.Wait(); err != nil {
		t.Errorf("Wait on a completed job: %v", err)
	}
	for _, p := range []Process{running, again} {
		if err := p.Wait(); err != nil {
			t.Errorf("Wait of the runner before and after its restart: %v", err)
		}
	}
}

// setJobCondition finishes the Job as the Job controller would.
func (kt *kubeTest) setJobCondition(t *testing.T, name string, typ batchv1.JobConditionType, reason string) {
	t.Helper()
	job := kt.job(t, name)
	now := metav1.Now()
	job.Status.StartTime = &now
	cond := func(typ batchv1.JobConditionType) batchv1.JobCondition {
		return batchv1.JobCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: "set by the test", LastTransitionTime: now}
	}
	switch typ {
	case batchv1.JobComplete:
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &now
		job.Status.Conditions = append(job.Status.Conditions, cond(batchv1.JobSuccessCriteriaMet), cond(batchv1.JobComplete))
	case batchv1.JobFailed:
		job.Status.Failed = 1
		job.Status.Conditions = append(job.Status.Conditions, cond(batchv1.JobFailureTarget), cond(batchv1.JobFailed))
	}
	if _, err := kt.client.BatchV1().Jobs(kt.ns).UpdateStatus(t.Context(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createPod makes the Job's pod, as the Job controller and scheduler
// would, with status set as the kubelet would.
func (kt *kubeTest) createPod(t *testing.T, jobName string, status corev1.PodStatus) {
	t.Helper()
	job := kt.job(t, jobName)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: jobName + "-x7k2p", Labels: job.Spec.Template.Labels},
		Spec:       *job.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-1"
	created, err := kt.client.CoreV1().Pods(kt.ns).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = status
	if _, err := kt.client.CoreV1().Pods(kt.ns).UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func terminated(name string, code int32, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}
}

func waiting(name, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: "x", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "as the kubelet says"}}}
}

// Job and pod status, written here as the controllers and kubelet of a
// real cluster would, map to Wait's result.
func TestKubeStatus(t *testing.T) {
	t.Parallel()
	cfg := testKubeConfig()
	cfg.StartGrace = 0
	kt := newKubeTest(t, cfg)
	hostDone := terminated(HostInitContainer, 0, "Completed")
	for _, tt := range []struct {
		name string
		// pod is the pod's status (none when its phase is empty).
		pod      corev1.PodStatus
		finish   batchv1.JobConditionType
		reason   string
		check    func(error) bool
		wantText string
	}{
		{
			name:   "complete",
			pod:    corev1.PodStatus{Phase: corev1.PodSucceeded, InitContainerStatuses: []corev1.ContainerStatus{hostDone}, ContainerStatuses: []corev1.ContainerStatus{terminated(AgentContainer, 0, "Completed")}},
			finish: batchv1.JobComplete,
			check:  func(err error) bool { return err == nil },
		},
		{
			name:   "agent exits 3",
			pod:    corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{hostDone}, ContainerStatuses: []corev1.ContainerStatus{terminated(AgentContainer, 3, "Error")}},
			finish: batchv1.JobFailed, reason: batchv1.JobReasonBackoffLimitExceeded,
			check: func(err error) bool {
				var exit *ExitError
				return errors.As(err, &exit) && exit.ExitCode == 3 && exit.Container == AgentContainer && errors.Is(err, ErrJobFailed)
			},
			wantText: "exit code 3 (Error)",
		},
		{
			name:   "agent out of memory",
			pod:    corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{hostDone}, ContainerStatuses: []corev1.ContainerStatus{terminated(AgentContainer, 137, "OOMKilled")}},
			finish: batchv1.JobFailed, reason: batchv1.JobReasonBackoffLimitExceeded,
			check: func(err error) bool {
				var exit *ExitError
				return errors.As(err, &exit) && exit.Reason == "OOMKilled"
			},
			wantText: "exit code 137 (OOMKilled)",
		},
		{
			name:   "agent-host install fails",
			pod:    corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{terminated(HostInitContainer, 1, "Error")}, ContainerStatuses: []corev1.ContainerStatus{waiting(AgentContainer, "PodInitializing")}},
			finish: batchv1.JobFailed, reason: batchv1.JobReasonBackoffLimitExceeded,
			check: func(err error) bool {
				var exit *ExitError
				return errors.As(err, &exit) && exit.Container == HostInitContainer
			},
			wantText: "container agent-host-install: exit code 1",
		},
		{
			name:   "pod evicted",
			pod:    corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."},
			finish: batchv1.JobFailed, reason: batchv1.JobReasonBackoffLimitExceeded,
			check: func(err error) bool {
				var exit *ExitError
				return errors.Is(err, ErrJobFailed) && !errors.As(err, &exit)
			},
			wantText: "Evicted: The node was low on resource: memory.",
		},
		{
			name:   "deadline exceeded",
			finish: batchv1.JobFailed, reason: batchv1.JobReasonDeadlineExceeded,
			check:    func(err error) bool { return errors.Is(err, ErrDeadlineExceeded) && errors.Is(err, ErrJobFailed) },
			wantText: "deadline exceeded",
		},
		{
			name:   "failed without a pod",
			finish: batchv1.JobFailed, reason: "PodFailurePolicy",
			check: func(err error) bool {
				var exit *ExitError
				return errors.Is(err, ErrJobFailed) && !errors.As(err, &exit)
			},
			wantText: "PodFailurePolicy",
		},
		{
			name:     "image never pulled",
			pod:      corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{hostDone}, ContainerStatuses: []corev1.ContainerStatus{waiting(AgentContainer, "ErrImageNeverPull")}},
			check:    func(err error) bool { return errors.Is(err, ErrCannotStart) },
			wantText: "ErrImageNeverPull",
		},
		{
			name:     "container config error",
			pod:      corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{waiting(HostInitContainer, "CreateContainerConfigError")}, ContainerStatuses: []corev1.ContainerStatus{waiting(AgentContainer, "PodInitializing")}},
			check:    func(err error) bool { return errors.Is(err, ErrCannotStart) },
			wantText: "CreateContainerConfigError",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := strings.ReplaceAll(tt.name, " ", "-")
			p, err := kt.exec.Start(t.Context(), agentSpec(id, 1), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if tt.pod.Phase != "" {
				kt.createPod(t, p.ID(), tt.pod)
			}
			if tt.finish != "" {
				kt.setJobCondition(t, p.ID(), tt.finish, tt.reason)
			}
			err = p.Wait()
			if !tt.check(err) {
				t.Errorf("Wait: %v (%T)", err, err)
			}
			if tt.wantText != "" && (err == nil || !strings.Contains(err.Error(), tt.wantText)) {
				t.Errorf("Wait: %v, want it to say %q", err, tt.wantText)
			}
			if errors.Is(err, ErrCannotStart) {
				// The pod would wait for ever: the executor deleted the Job.
				testenv.Eventually(t, time.Minute, "the executor to delete the Job", func() bool {
					return kt.job(t, p.ID()).DeletionTimestamp != nil
				})
			}
			phased := testenv.As[PhasedProcess](t, p, "the process")
			if got := phased.Phase(); got != PhaseFinished {
				t.Errorf("phase %s after Wait", got)
			}
			var last Phase
			for ph := range phased.PhaseChanges() {
				last = ph
			}
			if last != PhaseFinished {
				t.Errorf("the last phase change was %q, want finished", last)
			}
		})
	}
}

// Phase follows the pod: pending, then pending image once scheduled, then
// running with the agent's container.
func TestKubePhase(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	p, err := kt.exec.Start(t.Context(), agentSpec("phases", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	phased := testenv.As[PhasedProcess](t, p, "the process")
	if got := phased.Phase(); got != PhasePending {
		t.Errorf("phase %s before any pod", got)
	}
	// Pulling stays pending image, whatever the grace (an hour here).
	kt.createPod(t, p.ID(), corev1.PodStatus{Phase: corev1.PodPending,
		InitContainerStatuses: []corev1.ContainerStatus{terminated(HostInitContainer, 0, "Completed")},
		ContainerStatuses:     []corev1.ContainerStatus{waiting(AgentContainer, "ErrImagePull")}})
	awaitPhase(t, phased, PhasePendingImage)
	pod, err := kt.client.CoreV1().Pods(kt.ns).Get(t.Context(), p.ID()+"-x7k2p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: AgentContainer, Image: "x", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := kt.client.CoreV1().Pods(kt.ns).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitPhase(t, phased, PhaseRunning)
	select {
	case <-testenv.As[*kubeProcess](t, p, "the process").done:
		t.Fatalf("Wait returned while running: %v", p.Wait())
	default:
	}
}

// awaitPhase receives p's phase changes until want.
func awaitPhase(t *testing.T, p PhasedProcess, want Phase) {
	t.Helper()
	for ph := range p.PhaseChanges() {
		if ph == want {
			if got := p.Phase(); got != want {
				t.Errorf("Phase() = %s after the change to %s", got, want)
			}
			return
		}
	}
	t.Fatalf("finished (%v) without reaching phase %s", p.Wait(), want)
}

func TestKubeConfigValidate(t *testing.T) {
	t.Parallel()
	good := testKubeConfig()
	good.Namespace = "agents"
	for _, tt := range []struct {
		name string
		edit func(*KubeConfig)
		want string
	}{
		{"good", func(*KubeConfig) {}, ""},
		{"bad namespace", func(c *KubeConfig) { c.Namespace = "Agents!" }, "CONCLAVE_RUNNER_KUBE_NAMESPACE"},
		{"bad pull policy", func(c *KubeConfig) { c.ImagePullPolicy = "Sometimes" }, "CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY"},
		{"claim without root", func(c *KubeConfig) { c.WorkspaceClaim = "ws" }, "CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT"},
		{"relative mount", func(c *KubeConfig) { c.WorkspaceMount = "workspace" }, "CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT"},
		{"mount over agent-host", func(c *KubeConfig) { c.WorkspaceMount = hostBinDir }, "CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT"},
		{"negative ttl", func(c *KubeConfig) { c.TTLAfterFinish = -time.Second }, "CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED"},
		{"bad glob", func(c *KubeConfig) { c.SecretEnv = []string{"[_KEY"} }, "CONCLAVE_RUNNER_KUBE_SECRET_ENV"},
		{"bad service account", func(c *KubeConfig) { c.ServiceAccount = "A_B" }, "CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := good
			tt.edit(&c)
			err := c.Validate()
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate: %v, want %q", err, tt.want)
			}
		})
	}
	// Whichever executor runs, the zero value validates; the executor
	// itself wants a namespace and agent-host's image.
	if err := (KubeConfig{}).Validate(); err != nil {
		t.Errorf("the zero KubeConfig: %v", err)
	}
	for _, c := range []KubeConfig{{HostImage: "x"}, {Namespace: "agents"}} {
		if _, err := NewKubernetes(c, kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"}), nil); err == nil {
			t.Errorf("NewKubernetes(%+v) accepted", c)
		}
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

// Once Run ends, Wait returns rather than waiting for a Job it cannot see,
// and the Job is left for the next runner to adopt.
func TestKubeRunEndReleasesWait(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	exec, err := NewKubernetes(KubeConfig{Namespace: kt.ns, HostImage: "conclave/agent-host:test"}, kt.runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- exec.Run(ctx) }()
	p, err := exec.Start(t.Context(), agentSpec("left-running", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); !errors.Is(err, ErrNotWatching) {
		t.Errorf("Wait: %v, want ErrNotWatching", err)
	}
	if job := kt.job(t, p.ID()); job.DeletionTimestamp != nil {
		t.Error("the Job was deleted")
	}
	if _, err := exec.Start(t.Context(), agentSpec("after-the-end", 1), io.Discard); !errors.Is(err, ErrNotWatching) {
		t.Errorf("Start after Run: %v, want ErrNotWatching", err)
	}
	if err := exec.Run(t.Context()); err == nil {
		t.Error("a second Run started")
	}
}

// An image that will not start fails the launch once the grace has passed
// since it was first seen, though nothing changes in between.
func TestKubeStartGrace(t *testing.T) {
	t.Parallel()
	cfg := testKubeConfig()
	cfg.StartGrace = 200 * time.Millisecond
	kt := newKubeTest(t, cfg)
	p, err := kt.exec.Start(t.Context(), agentSpec("no-such-image", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	kt.createPod(t, p.ID(), corev1.PodStatus{Phase: corev1.PodPending,
		InitContainerStatuses: []corev1.ContainerStatus{terminated(HostInitContainer, 0, "Completed")},
		ContainerStatuses:     []corev1.ContainerStatus{waiting(AgentContainer, "ImagePullBackOff")}})
	if err := p.Wait(); !errors.Is(err, ErrCannotStart) || !strings.Contains(err.Error(), "ImagePullBackOff: as the kubelet says") {
		t.Errorf("Wait: %v, want ErrCannotStart with the reason and message", err)
	}
}

// The constructor the runner's service uses: a client from a kubeconfig
// file, or a clear error without one outside a cluster.
func TestKubeFromConfig(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	cfg := testKubeConfig()
	cfg.Namespace, cfg.Kubeconfig = kt.ns, kubeEnv.Kubeconfig
	exec, err := NewKubernetesFromConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- exec.Run(ctx) }()
	p, err := exec.Start(t.Context(), agentSpec("from-kubeconfig", 1), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	kt.job(t, p.ID())
	cancel()
	if err := <-ran; err != nil {
		t.Error(err)
	}

	for _, tt := range []struct {
		kubeconfig, want string
	}{
		{"/nonexistent/kubeconfig", "CONCLAVE_RUNNER_KUBE_KUBECONFIG"},
		// Not in a pod: no service account to fall back on.
		{"", "CONCLAVE_RUNNER_KUBE_KUBECONFIG"},
	} {
		c := testKubeConfig()
		c.Namespace, c.Kubeconfig = kt.ns, tt.kubeconfig
		if _, err := NewKubernetesFromConfig(c, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("kubeconfig %q: %v, want an error naming %s", tt.kubeconfig, err, tt.want)
		}
	}
}

// Two replicas starting the same launch at once end with one Job, both
// following it, and its Secret owned by it.
func TestKubeConcurrentStart(t *testing.T) {
	t.Parallel()
	kt := newKubeTest(t, testKubeConfig())
	other := kt.runExecutor(t, testKubeConfig())
	type started struct {
		p   Process
		err error
	}
	results := make(chan started, 2)
	for _, exec := range []*Kubernetes{kt.exec, other} {
		go func() {
			p, err := exec.Start(t.Context(), agentSpec("raced", 1), io.Discard)
			results <- started{p, err}
		}()
	}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
	}
	jobs, err := kt.client.BatchV1().Jobs(kt.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("jobs %v, %v; want one", jobs, err)
	}
	secret, err := kt.client.CoreV1().Secrets(kt.ns).Get(t.Context(), jobs.Items[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := secret.OwnerReferences; len(refs) != 1 || refs[0].UID != jobs.Items[0].UID {
		t.Errorf("secret owners %+v, want the Job", refs)
	}
}
