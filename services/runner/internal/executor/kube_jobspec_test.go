package executor

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

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
