package executor

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

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
