package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	batchv1client "k8s.io/client-go/kubernetes/typed/batch/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Errors a Kubernetes Process's Wait returns; each is wrapped with the
// details (the Job, the condition's or the container's message).
var (
	// ErrJobFailed is wrapped by every failure of the Job: an *ExitError,
	// ErrDeadlineExceeded, ErrCannotStart, and a Job failed for another
	// reason (its Failed condition's reason and message).
	ErrJobFailed = errors.New("agent job failed")
	// ErrDeadlineExceeded: the Job ran past its activeDeadlineSeconds
	// (the agent type's timeout) and Kubernetes ended it.
	ErrDeadlineExceeded = fmt.Errorf("%w: deadline exceeded", ErrJobFailed)
	// ErrCannotStart: the pod could not start a container's image
	// (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName,
	// CreateContainerConfigError, CreateContainerError) for longer than
	// CONCLAVE_RUNNER_KUBE_START_GRACE. The executor deletes the Job.
	ErrCannotStart = fmt.Errorf("%w: cannot start the agent's pod", ErrJobFailed)
	// ErrJobDeleted: the Job was deleted before it finished (Kill, or
	// anyone else).
	ErrJobDeleted = errors.New("agent job deleted")
	// ErrNotWatching: the executor's Run ended (the runner is stopping),
	// so the Job's end can no longer be seen. The Job goes on: a runner
	// that starts the launch again adopts it.
	ErrNotWatching = errors.New("the kubernetes executor stopped watching")
)

// ExitError is a container of the agent's pod that exited non-zero (or was
// killed: OOMKilled), failing the Job.
type ExitError struct {
	Job       string
	Container string
	ExitCode  int32
	// Reason is the container's terminated reason: Error, OOMKilled, ...
	Reason  string
	Message string
}

func (e *ExitError) Error() string {
	s := fmt.Sprintf("job %s: container %s: exit code %d", e.Job, e.Container, e.ExitCode)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap makes an ExitError an ErrJobFailed.
func (e *ExitError) Unwrap() error { return ErrJobFailed }

// Phase is where a Kubernetes Process is, for status.
type Phase string

// Phases of a Kubernetes Process.
const (
	// PhasePending: the Job exists; no pod has been scheduled yet.
	PhasePending Phase = "pending"
	// PhasePendingImage: the pod is scheduled and its containers are not
	// running yet: images pulling, agent-host being installed.
	PhasePendingImage Phase = "pending image"
	// PhaseRunning: the agent's container is running.
	PhaseRunning Phase = "running"
	// PhaseFinished: Wait has its result.
	PhaseFinished Phase = "finished"
)

// PhasedProcess is a Process that reports its Phase.
type PhasedProcess interface {
	Process
	Phase() Phase
	// PhaseChanges receives the phase as it changes (the latest one only,
	// if the receiver is behind), and is closed once finished.
	PhaseChanges() <-chan Phase
}

var _ PhasedProcess = (*kubeProcess)(nil)

// cannotStartReasons are container waiting reasons that do not go away by
// waiting a few seconds, unlike ContainerCreating and PodInitializing.
var cannotStartReasons = map[string]bool{
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
}

// Kubernetes runs each launch as a batch/v1 Job whose pod runs agent-host,
// which runs the agent and dials back to the runner: the Process has no
// stdio. Run must be running for Start to work.
type Kubernetes struct {
	cfg    KubeConfig
	client KubeClient
	logger *slog.Logger
	// now is the clock of the start grace.
	now func() time.Time

	jobs   batchlisters.JobLister
	pods   corelisters.PodLister
	synced chan struct{}
	// ended is closed when Run returns.
	ended chan struct{}
	ran   sync.Once

	mu    sync.Mutex
	procs map[string]*kubeProcess // by Job name
	// stopped: Run has ended; Start refuses.
	stopped bool
}

// KubeClient is what the executor asks of the API server: the core and
// batch typed clients. A kubernetes.Interface is one; the runner builds
// only these two (NewKubeClient), sparing its binary the clients, informers
// and apply configurations of every other API group client-go has.
type KubeClient interface {
	CoreV1() corev1client.CoreV1Interface
	BatchV1() batchv1client.BatchV1Interface
}

var _ KubeClient = kubeClient{}

type kubeClient struct {
	core  *corev1client.CoreV1Client
	batch *batchv1client.BatchV1Client
}

func (c kubeClient) CoreV1() corev1client.CoreV1Interface    { return c.core }
func (c kubeClient) BatchV1() batchv1client.BatchV1Interface { return c.batch }

// NewKubeClient builds the core and batch clients on rc, sharing one HTTP
// client, as kubernetes.NewForConfig does for all of its groups.
func NewKubeClient(rc *rest.Config) (KubeClient, error) {
	httpClient, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	core, err := corev1client.NewForConfigAndClient(rc, httpClient)
	if err != nil {
		return nil, err
	}
	batch, err := batchv1client.NewForConfigAndClient(rc, httpClient)
	if err != nil {
		return nil, err
	}
	return kubeClient{core: core, batch: batch}, nil
}

// NewKubernetes builds the executor on client; cfg must name the namespace
// (see ServiceAccountNamespace) and the agent-host image.
func NewKubernetes(cfg KubeConfig, client KubeClient, logger *slog.Logger) (*Kubernetes, error) {
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("the Kubernetes executor needs a client")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Kubernetes{
		cfg: cfg, client: client, logger: logger, now: time.Now,
		synced: make(chan struct{}), ended: make(chan struct{}), procs: map[string]*kubeProcess{},
	}, nil
}

// newInformer is an informer of one namespace's objects of obj's kind,
// indexed by namespace as the listers expect.
func newInformer(obj runtime.Object, list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn},
		obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// Name is "kubernetes".
func (*Kubernetes) Name() string { return "kubernetes" }

// Run watches the namespace's agent Jobs and their pods (those labelled
// managed-by conclave-runner) until ctx ends. Start waits for its caches to
// fill. Run may be called once.
func (k *Kubernetes) Run(ctx context.Context) error {
	first := false
	k.ran.Do(func() { first = true })
	if !first {
		return errors.New("the Kubernetes executor is already running")
	}
	defer close(k.ended)
	// Only the runner's own Jobs and pods, in its namespace.
	managed := func(o metav1.ListOptions) metav1.ListOptions {
		o.LabelSelector = LabelManagedBy + "=" + ManagedByRunner
		return o
	}
	ns := k.cfg.Namespace
	jobs := newInformer(&batchv1.Job{}, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return k.client.BatchV1().Jobs(ns).List(ctx, managed(o))
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return k.client.BatchV1().Jobs(ns).Watch(ctx, managed(o))
	})
	pods := newInformer(&corev1.Pod{}, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return k.client.CoreV1().Pods(ns).List(ctx, managed(o))
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return k.client.CoreV1().Pods(ns).Watch(ctx, managed(o))
	})
	k.jobs, k.pods = batchlisters.NewJobLister(jobs.GetIndexer()), corelisters.NewPodLister(pods.GetIndexer())
	onJob := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.jobChanged(obj) },
		UpdateFunc: func(_, obj any) { k.jobChanged(obj) },
		DeleteFunc: func(obj any) { k.jobChanged(obj) },
	}
	onPod := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.podChanged(obj) },
		UpdateFunc: func(_, obj any) { k.podChanged(obj) },
		DeleteFunc: func(obj any) { k.podChanged(obj) },
	}
	if _, err := jobs.AddEventHandler(onJob); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(onPod); err != nil {
		return err
	}
	var running sync.WaitGroup
	for _, inf := range []cache.SharedIndexInformer{jobs, pods} {
		running.Go(func() { inf.RunWithContext(ctx) })
	}
	// Returning waits for the informers, which stop with ctx.
	defer running.Wait()
	if !cache.WaitForCacheSync(ctx.Done(), jobs.HasSynced, pods.HasSynced) {
		return nil // ctx ended first: nothing else stops the wait
	}
	close(k.synced)
	k.logger.Info("kubernetes executor watching", "namespace", k.cfg.Namespace)
	<-ctx.Done()
	k.mu.Lock()
	procs := make([]*kubeProcess, 0, len(k.procs))
	for _, p := range k.procs {
		procs = append(procs, p)
	}
	k.stopped = true
	k.mu.Unlock()
	for _, p := range procs {
		p.finish(fmt.Errorf("job %s: %w", p.name, ErrNotWatching))
	}
	return nil
}

func objectName(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		if _, isPod := obj.(*corev1.Pod); isPod {
			return m.GetLabels()[LabelJob]
		}
		return m.GetName()
	}
	return ""
}

func (k *Kubernetes) jobChanged(obj any) { k.evaluate(objectName(obj)) }
func (k *Kubernetes) podChanged(obj any) { k.evaluate(objectName(obj)) }

func (k *Kubernetes) evaluate(job string) {
	k.mu.Lock()
	p := k.procs[job]
	k.mu.Unlock()
	if p != nil {
		p.evaluate()
	}
}

// Start creates the launch's Secret and Job, or adopts the launch's Job
// when it exists already (the runner restarted): agent-host in its pod
// reconnects. A finished Job's Process returns its result at once. stderr
// is unused: agent-host sends the agent's stderr to the runner.
func (k *Kubernetes) Start(ctx context.Context, spec Spec, _ io.Writer) (Process, error) {
	objs, err := k.buildJob(spec)
	if err != nil {
		return nil, err
	}
	select {
	case <-k.synced:
	case <-k.ended:
		return nil, ErrNotWatching
	case <-ctx.Done():
		return nil, fmt.Errorf("the Kubernetes executor's watch has not started (is Run running?): %w", ctx.Err())
	}
	name := objs.job.Name
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return nil, ErrNotWatching
	}
	if p := k.procs[name]; p != nil {
		k.mu.Unlock()
		return p, nil
	}
	k.mu.Unlock()

	jobs := k.client.BatchV1().Jobs(k.cfg.Namespace)
	existing, err := jobs.Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return k.adopt(ctx, existing, spec, objs.secret != nil)
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("looking up job %s: %w", name, err)
	}

	secrets := k.client.CoreV1().Secrets(k.cfg.Namespace)
	if objs.secret != nil {
		_, err := secrets.Create(ctx, objs.secret, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Left by a runner that died before creating the Job: its
			// values may be stale (the Secret is immutable).
			if err = k.deleteSecret(ctx, name); err == nil {
				_, err = secrets.Create(ctx, objs.secret, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("creating secret %s: %w", name, err)
		}
	}
	created, err := jobs.Create(ctx, objs.job, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Another replica started the same launch at the same moment.
		if existing, err := jobs.Get(ctx, name, metav1.GetOptions{}); err == nil {
			return k.adopt(ctx, existing, spec, objs.secret != nil)
		}
	}
	if err != nil {
		if objs.secret != nil {
			k.abandonSecret(ctx, name, err)
		}
		return nil, fmt.Errorf("creating job %s: %w", name, err)
	}
	if objs.secret != nil {
		k.ownSecret(ctx, created)
	}
	k.logger.Info("created the launch's job", "job", name, "instance_id", spec.InstanceID, "launch", spec.Launch)
	return k.track(name, created.UID), nil
}

// adopt follows a launch's Job that exists already.
func (k *Kubernetes) adopt(ctx context.Context, job *batchv1.Job, spec Spec, hasSecret bool) (Process, error) {
	if err := sameLaunch(job, spec); err != nil {
		return nil, err
	}
	k.logger.Info("adopting the launch's job", "job", job.Name, "instance_id", spec.InstanceID, "launch", spec.Launch)
	// A runner that died between creating the Job and owning the Secret
	// to it left the Secret without an owner.
	if hasSecret {
		k.ownSecret(ctx, job)
	}
	return k.track(job.Name, job.UID), nil
}

// sameLaunch checks that job, found under the launch's name, is that
// launch's: names shorten ids, so another's could in principle collide.
func sameLaunch(job *batchv1.Job, spec Spec) error {
	if job.Annotations[AnnotationInstance] != spec.InstanceID || job.Labels[LabelLaunch] != strconv.FormatInt(spec.Launch, 10) {
		return fmt.Errorf("job %s exists for instance %q launch %s, not instance %q launch %d",
			job.Name, job.Annotations[AnnotationInstance], job.Labels[LabelLaunch], spec.InstanceID, spec.Launch)
	}
	return nil
}

// ownSecret makes the Job the owner of its Secret, for the garbage
// collector to delete the Secret with the Job (after its TTL, or any
// deletion). Not blockOwnerDeletion: that would need update on
// jobs/finalizers, and Kill deletes the Secret itself. A failure is
// logged: the Secret then goes on Kill only.
func (k *Kubernetes) ownSecret(ctx context.Context, job *batchv1.Job) {
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":%q,"uid":%q}]}}`, job.Name, job.UID)
	_, err := k.client.CoreV1().Secrets(k.cfg.Namespace).Patch(ctx, job.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		k.logger.Warn("setting the job as its secret's owner", "secret", job.Name, "err", err)
	}
}

// abandonSecret deletes the Secret of a Job whose creation failed with
// err. When err is not the API server's answer (a timeout, a dropped
// connection), the Job may exist all the same: then the Secret is its, and
// is owned to it instead, for the next Start to adopt the two.
func (k *Kubernetes) abandonSecret(ctx context.Context, name string, err error) {
	// Not ctx: it may be why the create failed.
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, answered := err.(apierrors.APIStatus); !answered {
		if job, gerr := k.client.BatchV1().Jobs(k.cfg.Namespace).Get(cleanup, name, metav1.GetOptions{}); gerr == nil {
			k.ownSecret(cleanup, job)
			return
		}
	}
	if derr := k.deleteSecret(cleanup, name); derr != nil {
		k.logger.Warn("deleting the secret of a job not created", "secret", name, "err", derr)
	}
}

func (k *Kubernetes) deleteSecret(ctx context.Context, name string) error {
	err := k.client.CoreV1().Secrets(k.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// track registers the Process of Job name and evaluates it against what the
// caches hold.
func (k *Kubernetes) track(name string, uid types.UID) *kubeProcess {
	k.mu.Lock()
	if p := k.procs[name]; p != nil {
		k.mu.Unlock()
		return p
	}
	p := &kubeProcess{k: k, name: name, uid: uid, phase: PhasePending, changes: make(chan Phase, 1), done: make(chan struct{})}
	if k.stopped {
		k.mu.Unlock()
		p.finish(fmt.Errorf("job %s: %w", name, ErrNotWatching))
		return p
	}
	k.procs[name] = p
	k.mu.Unlock()
	p.evaluate()
	return p
}

func (k *Kubernetes) untrack(p *kubeProcess) {
	k.mu.Lock()
	if k.procs[p.name] == p {
		delete(k.procs, p.name)
	}
	k.mu.Unlock()
}

// kubeProcess is one launch's Job, followed through the executor's caches.
type kubeProcess struct {
	k    *Kubernetes
	name string
	uid  types.UID
	done chan struct{}

	mu sync.Mutex
	// seen: the cache has held the Job, so its absence means deleted.
	seen    bool
	phase   Phase
	changes chan Phase
	// stuckSince is when a container was first seen unable to start.
	stuckSince time.Time
	stuckTimer *time.Timer
	err        error
}

func (p *kubeProcess) ID() string { return p.name }

func (p *kubeProcess) Wait() error {
	<-p.done
	return p.err
}

func (p *kubeProcess) Phase() Phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.phase
}

// PhaseChanges holds the latest phase not yet received, and is closed
// after PhaseFinished.
func (p *kubeProcess) PhaseChanges() <-chan Phase { return p.changes }

// setPhaseLocked records ph and offers it on changes, replacing a phase
// not yet received: only the latest matters. p.mu is held.
func (p *kubeProcess) setPhaseLocked(ph Phase) {
	if ph == p.phase {
		return
	}
	p.phase = ph
	select {
	case <-p.changes:
	default:
	}
	p.changes <- ph
}

// Kill deletes the Job, its pods first (foreground), and its Secret. Wait
// returns once the Job is gone (or had finished).
func (p *kubeProcess) Kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.deleteJob(ctx)
}

func (p *kubeProcess) deleteJob(ctx context.Context) error {
	ns := p.k.cfg.Namespace
	err := p.k.client.BatchV1().Jobs(ns).Delete(ctx, p.name, metav1.DeleteOptions{
		PropagationPolicy: ptr.To(metav1.DeletePropagationForeground),
		// Never another Job that took the name since.
		Preconditions: &metav1.Preconditions{UID: &p.uid},
	})
	gone := apierrors.IsNotFound(err) || apierrors.IsConflict(err)
	if err != nil && !gone {
		return fmt.Errorf("deleting job %s: %w", p.name, err)
	}
	if err := p.k.deleteSecret(ctx, p.name); err != nil {
		return fmt.Errorf("deleting secret %s: %w", p.name, err)
	}
	if gone {
		p.finish(fmt.Errorf("job %s: %w", p.name, ErrJobDeleted))
	}
	return nil
}

// finish ends Wait with err, once.
func (p *kubeProcess) finish(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finishLocked(err)
}

func (p *kubeProcess) finishLocked(err error) {
	select {
	case <-p.done:
		return
	default:
	}
	if p.stuckTimer != nil {
		p.stuckTimer.Stop()
	}
	p.err = err
	p.setPhaseLocked(PhaseFinished)
	close(p.changes)
	close(p.done)
	p.k.untrack(p)
}

// evaluate maps the cached Job and pods to the Process.
func (p *kubeProcess) evaluate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	job, err := p.k.jobs.Jobs(p.k.cfg.Namespace).Get(p.name)
	if err != nil || job.UID != p.uid {
		if p.seen {
			p.finishLocked(fmt.Errorf("job %s: %w", p.name, ErrJobDeleted))
		}
		return
	}
	p.seen = true
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			p.finishLocked(nil)
			return
		case batchv1.JobFailed:
			p.finishLocked(p.failure(job, c))
			return
		}
	}
	if job.DeletionTimestamp != nil {
		// Going (Kill, or anyone's delete): the pods first, then the Job.
		return
	}
	pods, _ := p.k.pods.Pods(p.k.cfg.Namespace).List(labels.SelectorFromSet(labels.Set{LabelJob: p.name}))
	phase := PhasePending
	var stuck *corev1.ContainerStatus
	for _, pod := range pods {
		if phase == PhasePending && (pod.Spec.NodeName != "" || podScheduled(pod)) {
			phase = PhasePendingImage
		}
		for _, cs := range append(statuses(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
			if cs.Name == AgentContainer && cs.State.Running != nil {
				phase = PhaseRunning
			}
			if w := cs.State.Waiting; w != nil && cannotStartReasons[w.Reason] && stuck == nil {
				stuck = &cs
			}
		}
	}
	p.setPhaseLocked(phase)
	if stuck == nil {
		p.stuckSince = time.Time{}
		return
	}
	now := p.k.now()
	if p.stuckSince.IsZero() {
		p.stuckSince = now
	}
	if wait := p.stuckSince.Add(p.k.cfg.StartGrace).Sub(now); wait > 0 {
		if p.stuckTimer != nil {
			p.stuckTimer.Stop()
		}
		p.stuckTimer = time.AfterFunc(wait, p.evaluate)
		return
	}
	w := stuck.State.Waiting
	p.finishLocked(fmt.Errorf("job %s: container %s: %s: %s: %w", p.name, stuck.Name, w.Reason, w.Message, ErrCannotStart))
	// Its pod would wait for ever: the Job goes.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.deleteJob(ctx); err != nil {
			p.k.logger.Warn("deleting a job whose pod cannot start", "job", p.name, "err", err)
		}
	}()
}

func statuses(s []corev1.ContainerStatus) []corev1.ContainerStatus {
	return append([]corev1.ContainerStatus(nil), s...)
}

func podScheduled(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// failure is the error of a Job failed with condition c: the deadline, or
// the exit of a container of its pod, or the condition itself.
func (p *kubeProcess) failure(job *batchv1.Job, c batchv1.JobCondition) error {
	if c.Reason == batchv1.JobReasonDeadlineExceeded {
		return fmt.Errorf("job %s: %s: %w", job.Name, c.Message, ErrDeadlineExceeded)
	}
	pods, _ := p.k.pods.Pods(p.k.cfg.Namespace).List(labels.SelectorFromSet(labels.Set{LabelJob: p.name}))
	if exit := exitOf(job.Name, pods); exit != nil {
		return exit
	}
	// The pod's last status may not be in the cache yet: ask.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := p.k.client.CoreV1().Pods(p.k.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelJob + "=" + p.name})
	if err == nil {
		listed := make([]*corev1.Pod, len(list.Items))
		for i := range list.Items {
			listed[i] = &list.Items[i]
		}
		if exit := exitOf(job.Name, listed); exit != nil {
			return exit
		}
		pods = listed
	}
	// A pod that failed without a container's exit: evicted, its node
	// lost, deleted.
	for _, pod := range pods {
		if pod.Status.Reason != "" {
			return fmt.Errorf("job %s: %s: %s: pod %s: %s: %s: %w", job.Name, c.Reason, c.Message, pod.Name, pod.Status.Reason, pod.Status.Message, ErrJobFailed)
		}
	}
	return fmt.Errorf("job %s: %s: %s: %w", job.Name, c.Reason, c.Message, ErrJobFailed)
}

// exitOf is the first container of pods that terminated in failure,
// init containers first (the agent never ran after one of them failed).
func exitOf(job string, pods []*corev1.Pod) *ExitError {
	for _, pod := range pods {
		for _, cs := range append(statuses(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
			if t := cs.State.Terminated; t != nil && (t.ExitCode != 0 || t.Reason == "OOMKilled") {
				return &ExitError{Job: job, Container: cs.Name, ExitCode: t.ExitCode, Reason: t.Reason, Message: t.Message}
			}
		}
	}
	return nil
}
