//go:build linux

package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

const (
	kubeNamespace  = "bench"
	kubeHostImage  = "local/agent-host:bench"
	kubeAgentImage = "local/acp-agent:bench"
	kubeAgentBin   = "/usr/local/bin/acp-agent"
)

// BenchmarkKubeFirstUpdate: one op is one launch on a real single-node
// cluster (pkg/testenv KubeNode), timed until its first session/update.
// "runner": POST /api/v1/agents/launch with the Kubernetes executor, then
// GET .../logs?follow=true until the first "acp" line; it also reports
// where the time went, from the instance's log lines' times. "bare-job":
// create a Job of the agent's image and watch until its pod is Running, as
// the API server reports it: the floor. Each launch is deleted, and its
// pod gone, before the next.
func BenchmarkKubeFirstUpdate(b *testing.B) {
	ctx := context.Background()
	node, err := kubeenv.KubeNode(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = node.Stop() })
	dir := b.TempDir()
	for _, img := range []struct{ ref, pkg, bin string }{
		{kubeHostImage, "./services/runner/cmd/agent-host", "/usr/local/bin/agent-host"},
		{kubeAgentImage, "./examples/acp-agent", kubeAgentBin},
	} {
		bin := filepath.Join(dir, filepath.Base(img.bin))
		if err := testenv.BuildStatic(ctx, img.pkg, bin); err != nil {
			b.Fatal(err)
		}
		tarball := bin + ".tar"
		if err := testenv.WriteImage(tarball, testenv.Image{Ref: img.ref, User: "65532:65532", Entrypoint: []string{img.bin},
			Files: []testenv.ImageFile{{Path: img.bin, HostPath: bin, Mode: 0o755}}}); err != nil {
			b.Fatal(err)
		}
		if err := node.ImportImage(ctx, tarball); err != nil {
			b.Fatal(err)
		}
	}
	cs, err := kubernetes.NewForConfig(node.Config)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeNamespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	testenv.EventuallyNoError(b, 5*time.Minute, "the namespace's default service account", func() error {
		_, err := cs.CoreV1().ServiceAccounts(kubeNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	})

	for _, floor := range []struct {
		name string
		init bool
	}{{"bare-job", false}, {"bare-job-init", true}} {
		b.Run(floor.name, func(b *testing.B) { benchBareJob(b, cs, floor.init) })
	}

	b.Run("runner", func(b *testing.B) {
		base := startKubeRunner(b, node)
		b.ResetTimer()
		var firstUpdate, jobCreated, hostStarted, sessionUp []time.Duration
		for i := 0; i < b.N; i++ {
			ws := "/workspace/" + fmt.Sprint(time.Now().UnixNano())
			start := time.Now()
			id := postLaunch(b, base, ws)
			api := &runnertest.API{Base: base}
			for l := range api.Follow(b, id, 0) {
				if l.Stream == "acp" {
					break
				}
			}
			firstUpdate = append(firstUpdate, time.Since(start))
			b.StopTimer()
			// Where the time went: the first time each step's line was
			// logged, from the launch.
			seen := map[string]bool{}
			for _, l := range api.Logs(b, id) {
				var step *[]time.Duration
				switch {
				case strings.HasPrefix(l.Text, "started normal as kubernetes"):
					step = &jobCreated
				case strings.HasPrefix(l.Text, "agent-host: started the agent"):
					step = &hostStarted
				case l.Text == "status: running":
					step = &sessionUp
				}
				if step != nil && !seen[l.Text] {
					seen[l.Text] = true
					*step = append(*step, l.Time.Sub(start))
				}
			}
			job := fmt.Sprintf("agent-%s-1", id)
			if code := request(b, "DELETE", base+"/api/v1/agents/"+id, ""); code != http.StatusOK {
				b.Fatalf("delete: HTTP %d", code)
			}
			waitJobGone(b, cs, job)
			b.StartTimer()
		}
		b.StopTimer()
		reportPercentiles(b, firstUpdate)
		for unit, samples := range map[string][]time.Duration{"job-created-p50-ms": jobCreated, "agent-started-p50-ms": hostStarted, "session-up-p50-ms": sessionUp} {
			if len(samples) > 0 {
				b.ReportMetric(percentile(samples, 50), unit)
			}
		}
	})
}

// benchBareJob times Job create to pod Running as the API server reports
// it, for the agent's image alone or (init) behind the executor's init
// container, which installs agent-host from its image first.
func benchBareJob(b *testing.B, cs kubernetes.Interface, init bool) {
	ctx := context.Background()
	samples := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bare-%d-%d", time.Now().UnixNano(), i)
		start := time.Now()
		job, err := cs.BatchV1().Jobs(kubeNamespace).Create(ctx, bareJob(name, init), metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		waitPodRunning(b, cs, name)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		deleteJob(b, cs, job.Name)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

func percentile(samples []time.Duration, p int) float64 {
	s := slices.Clone(samples)
	slices.Sort(s)
	return float64(s[len(s)*p/100]) / float64(time.Millisecond)
}

// bareJob is a Job of the agent's image as the executor makes it, without
// agent-host: its process waits on its stdin (which stays open) until the
// Job is deleted.
func bareJob(name string, init bool) *batchv1.Job {
	nonRoot := true
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"bench": name}},
				Spec: corev1.PodSpec{
					RestartPolicy:   corev1.RestartPolicyNever,
					SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &nonRoot},
					Containers: []corev1.Container{{
						Name: "agent", Image: kubeAgentImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{kubeAgentBin}, Stdin: true,
					}},
				},
			},
		},
	}
	if init {
		spec := &job.Spec.Template.Spec
		shared := []corev1.VolumeMount{{Name: "bin", MountPath: "/conclave/bin"}}
		spec.Volumes = []corev1.Volume{{Name: "bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		spec.InitContainers = []corev1.Container{{
			Name: "agent-host-install", Image: kubeHostImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/usr/local/bin/agent-host", "install", "/conclave/bin/agent-host"}, VolumeMounts: shared,
		}}
		spec.Containers[0].VolumeMounts = shared
	}
	return job
}

func waitPodRunning(b *testing.B, cs kubernetes.Interface, job string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := cs.CoreV1().Pods(kubeNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && pod.Status.Phase == corev1.PodRunning {
			return
		}
	}
	b.Fatalf("the pod of %s never ran", job)
}

func deleteJob(b *testing.B, cs kubernetes.Interface, name string) {
	fg := metav1.DeletePropagationForeground
	if err := cs.BatchV1().Jobs(kubeNamespace).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		b.Fatal(err)
	}
	waitJobGone(b, cs, name)
}

// waitJobGone runs with the timer stopped: its polling is not measured.
func waitJobGone(b *testing.B, cs kubernetes.Interface, name string) {
	b.Helper()
	ctx := context.Background()
	testenv.EventuallyNoError(b, 5*time.Minute, "Job "+name+" and its pods deleted", func() error {
		_, err := cs.BatchV1().Jobs(kubeNamespace).Get(ctx, name, metav1.GetOptions{})
		pods, perr := cs.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if perr != nil {
			b.Fatal(perr)
		}
		if !apierrors.IsNotFound(err) || len(pods.Items) != 0 {
			return fmt.Errorf("the Job: %v; %d pods", err, len(pods.Items))
		}
		return nil
	})
}

// startKubeRunner runs a runner with the Kubernetes executor on the node:
// its gRPC listener on loopback, reached by the pods through a forward
// from the node's address.
func startKubeRunner(b *testing.B, node *kubeenv.KubeNodeEnv) string {
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	grpcAddr := l.Addr().String()
	_ = l.Close()
	fwd, err := node.Forward(kubeenv.KubeNodeIP+":0", grpcAddr)
	if err != nil {
		b.Fatal(err)
	}
	types := filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, []byte(fmt.Sprintf("agent_types:\n  - id: normal\n    image: %s\n    command: [%s, -mode, slow-tool]\n    protocol: acp\n    permission: allow\n    enabled: true\n", kubeAgentImage, kubeAgentBin)), 0o644); err != nil {
		b.Fatal(err)
	}
	return startBenchRunner(b, map[string]string{
		"CONCLAVE_RUNNER_GRPC_ADDR": grpcAddr, "CONCLAVE_RUNNER_WORKSPACE_ROOTS": "/workspace",
		"CONCLAVE_RUNNER_AGENT_TYPES": types, "CONCLAVE_RUNNER_EXECUTOR": "kubernetes",
		"CONCLAVE_RUNNER_HOST_KEY": "bench-host-key-of-at-least-32-bytes!", "CONCLAVE_RUNNER_HOST_ADDR": fwd.Addr().String(),
		"CONCLAVE_RUNNER_KUBE_NAMESPACE": kubeNamespace, "CONCLAVE_RUNNER_KUBE_HOST_IMAGE": kubeHostImage,
		"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY": "Never",
	}, node.Config)
}

func postLaunch(b *testing.B, base, ws string) string {
	body := `{"task_id":"bench","agent_type":"normal","workspace_path":"` + ws + `","env":{"TASK_DESCRIPTION":"go"}}`
	resp, err := http.Post(base+"/api/v1/agents/launch", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var in struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("launch: HTTP %d: %v", resp.StatusCode, err)
	}
	return in.ID
}

func request(b *testing.B, method, url, body string) int {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
