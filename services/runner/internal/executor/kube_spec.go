package executor

import (
	"fmt"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Labels and annotations of the Jobs, pods and Secrets the executor makes.
const (
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	ManagedByRunner = "conclave-runner"
	LabelInstance   = "conclave.ai/instance-id"
	LabelTask       = "conclave.ai/task-id"
	LabelAgentType  = "conclave.ai/agent-type"
	LabelLaunch     = "conclave.ai/launch"
	// LabelJob is on the pod template: the Job a pod belongs to.
	LabelJob = "conclave.ai/job"
	// The exact ids, which the labels may have had to shorten.
	AnnotationInstance = "conclave.ai/instance-id"
	AnnotationTask     = "conclave.ai/task-id"
)

// Containers and volumes of an agent's pod.
const (
	AgentContainer    = "agent"
	HostInitContainer = "agent-host-install"
	hostBinVolume     = "agent-host-bin"
	workspaceVolume   = "workspace"
	hostBinDir        = "/conclave/bin"
	hostBinPath       = hostBinDir + "/agent-host"
	hostTokenEnv      = "CONCLAVE_AGENT_HOST_TOKEN"
	hostGatewayEnv    = "CONCLAVE_AGENT_HOST_GATEWAY_ADDR"
	hostGatewayToken  = "CONCLAVE_AGENT_HOST_GATEWAY_TOKEN"
	// hostEnvPrefix starts agent-host's settings, which come from the
	// runner alone.
	hostEnvPrefix      = "CONCLAVE_AGENT_HOST_"
	hostWorkspaceEnv   = "CONCLAVE_AGENT_HOST_WORKSPACE"
	hostLaunchEnv      = "CONCLAVE_AGENT_HOST_LAUNCH_ENV"
	hostLaunchAllowed  = "CONCLAVE_AGENT_HOST_LAUNCH_ENV_ALLOWED"
	hostInstallCommand = "install"
)

// jobObjects is what one launch creates: its Job, and the Secret holding
// the env values that must not be in the spec (nil when there are none).
type jobObjects struct {
	job    *batchv1.Job
	secret *corev1.Secret
}

// buildJob makes the Job and Secret of spec. Nothing is sent.
func (k *Kubernetes) buildJob(spec Spec) (jobObjects, error) {
	typ := spec.Type
	if spec.Launch < 1 {
		// Launches are numbered from 1; a Job is per launch, so an unset
		// number would make every launch adopt the first one's Job.
		return jobObjects{}, fmt.Errorf("launch %d of instance %s: the Kubernetes executor needs the launch number", spec.Launch, spec.InstanceID)
	}
	// The API refused such a launch; one stored before that rule, or whose
	// type has changed since, is refused here.
	if err := typ.CheckAgentEnv(spec.Env); err != nil {
		return jobObjects{}, err
	}
	if typ.Image == "" {
		return jobObjects{}, fmt.Errorf("agent type %s has no image for the Kubernetes executor", typ.ID)
	}
	if len(typ.Command) == 0 {
		return jobObjects{}, fmt.Errorf("agent type %s has no command: the Kubernetes executor runs it under agent-host, which needs the agent's command", typ.ID)
	}
	name := jobName(spec.InstanceID, spec.Launch)
	labels := map[string]string{
		LabelManagedBy: ManagedByRunner,
		LabelInstance:  labelValue(spec.InstanceID),
		LabelTask:      labelValue(spec.TaskID),
		LabelAgentType: labelValue(typ.ID),
		LabelLaunch:    strconv.FormatInt(spec.Launch, 10),
	}
	annotations := map[string]string{AnnotationInstance: spec.InstanceID, AnnotationTask: spec.TaskID}
	podLabels := map[string]string{LabelJob: name}
	for k, v := range labels {
		podLabels[k] = v
	}

	mount := k.cfg.WorkspaceMount
	if typ.WorkingDir != "" {
		mount = path.Clean(typ.WorkingDir)
		if !path.IsAbs(mount) || mount == hostBinDir || mount == "/" {
			return jobObjects{}, fmt.Errorf("agent type %s: working_dir %q cannot be the workspace's mount", typ.ID, typ.WorkingDir)
		}
	}
	workspace, subPath, err := k.workspaceVolume(spec.Workspace)
	if err != nil {
		return jobObjects{}, err
	}

	env, secretData := k.splitEnv(spec, name, mount)
	var secret *corev1.Secret
	if len(secretData) > 0 {
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.cfg.Namespace, Labels: labels, Annotations: annotations},
			Type:       corev1.SecretTypeOpaque,
			// Nothing ever changes a launch's values.
			Immutable: ptr.To(true),
			Data:      secretData,
		}
	}

	resources := containerResources(typ.MemoryMB, typ.CPUCores)
	hardened := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	pull := corev1.PullPolicy(k.cfg.ImagePullPolicy)
	deadline := int64(math.Ceil(typ.EffectiveTimeout().Seconds()))
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.cfg.Namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](0),
			ActiveDeadlineSeconds:   &deadline,
			TTLSecondsAfterFinished: ptr.To(int32(k.cfg.TTLAfterFinish.Seconds())),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: annotations},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					ServiceAccountName:           k.cfg.ServiceAccount,
					AutomountServiceAccountToken: ptr.To(false),
					// The agent gets the env it was given, not a variable
					// per Service in the namespace.
					EnableServiceLinks: ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(k.cfg.RunAsNonRoot),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					InitContainers: []corev1.Container{{
						Name:  HostInitContainer,
						Image: k.cfg.HostImage,
						// agent-host copies itself: its image needs no shell.
						Command:         []string{k.cfg.HostBinary, hostInstallCommand, hostBinPath},
						ImagePullPolicy: pull,
						// The pod's request is the larger of an init
						// container's and the containers': the same as the
						// agent's adds nothing, and satisfies a quota that
						// wants every container bounded.
						Resources:    resources,
						VolumeMounts: []corev1.VolumeMount{{Name: hostBinVolume, MountPath: hostBinDir}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							ReadOnlyRootFilesystem:   ptr.To(true),
						},
					}},
					Containers: []corev1.Container{{
						Name:            AgentContainer,
						Image:           typ.Image,
						Command:         append([]string{hostBinPath, "--"}, typ.Command...),
						WorkingDir:      mount,
						Env:             env,
						ImagePullPolicy: pull,
						Resources:       resources,
						VolumeMounts: []corev1.VolumeMount{
							{Name: hostBinVolume, MountPath: hostBinDir, ReadOnly: true},
							{Name: workspaceVolume, MountPath: mount, SubPath: subPath},
						},
						SecurityContext: hardened,
					}},
					Volumes: []corev1.Volume{
						{Name: hostBinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: workspaceVolume, VolumeSource: workspace},
					},
				},
			},
		},
	}
	return jobObjects{job: job, secret: secret}, nil
}

// workspaceVolume is the workspace's volume: a fresh emptyDir, or the
// claim, mounted at the launch's workspace_path relative to where the
// runner mounts the same claim.
func (k *Kubernetes) workspaceVolume(workspace string) (corev1.VolumeSource, string, error) {
	if k.cfg.WorkspaceClaim == "" {
		return corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}, "", nil
	}
	rel, err := filepath.Rel(k.cfg.WorkspaceRoot, workspace)
	if err != nil || !filepath.IsAbs(workspace) || rel == ".." || strings.HasPrefix(rel, "../") {
		return corev1.VolumeSource{}, "", fmt.Errorf("%w: workspace_path %q is not within CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT %q, where the workspace claim is mounted", ErrWorkspace, workspace, k.cfg.WorkspaceRoot)
	}
	if rel == "." {
		rel = ""
	}
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: k.cfg.WorkspaceClaim}}, filepath.ToSlash(rel), nil
}

// splitEnv is the container's env, sorted, with the values of secret names
// (and agent-host's token) referenced from the Secret name, and those
// values. agent-host's settings win over an agent env of the same name.
func (k *Kubernetes) splitEnv(spec Spec, secretName, mount string) ([]corev1.EnvVar, map[string][]byte) {
	all := make(map[string]string, len(spec.Env)+len(spec.Host.Env)+2)
	for n, v := range spec.Env {
		if strings.HasPrefix(n, hostEnvPrefix) {
			// agent-host's settings (where it dials, with which token)
			// are the runner's alone, never the agent's env's.
			continue
		}
		all[n] = v
	}
	// The agent's fs/* requests are confined to its workspace, wherever
	// this pod mounts it.
	all[hostWorkspaceEnv] = mount
	// agent-host checks again, before it starts the agent, that what the
	// launch set is what a launch may set: the Job's spec carries the env.
	all[hostLaunchAllowed] = strings.Join(spec.Type.LaunchEnvAllowed(), ",")
	if set := spec.Type.LaunchSet(spec.Env); len(set) > 0 {
		all[hostLaunchEnv] = strings.Join(set, ",")
	}
	for n, v := range spec.Host.Env {
		all[n] = v
	}
	secretNames := map[string]bool{}
	if spec.Host.Token != "" {
		all[hostTokenEnv] = spec.Host.Token
		secretNames[hostTokenEnv] = true
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	env := make([]corev1.EnvVar, 0, len(names))
	data := map[string][]byte{}
	for _, n := range names {
		if secretNames[n] || k.isSecretName(n) {
			data[n] = []byte(all[n])
			env = append(env, corev1.EnvVar{Name: n, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secretName}, Key: n,
			}}})
			continue
		}
		env = append(env, corev1.EnvVar{Name: n, Value: all[n]})
	}
	if all[hostGatewayEnv] != "" && k.cfg.GatewayTokenSecret != "" {
		// The operator's Secret, by reference: the runner never holds the
		// token, and it is in no spec or log.
		env = append(env, corev1.EnvVar{Name: hostGatewayToken, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: k.cfg.GatewayTokenSecret}, Key: k.cfg.GatewayTokenKey,
		}}})
		slices.SortFunc(env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	}
	return env, data
}

func (k *Kubernetes) isSecretName(name string) bool {
	for _, p := range k.cfg.SecretEnv {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// containerResources requests and limits the type's memory and CPU (the
// same, for the Guaranteed class); a zero leaves that resource unbounded.
func containerResources(memoryMB int, cpuCores float64) corev1.ResourceRequirements {
	list := corev1.ResourceList{}
	if memoryMB > 0 {
		list[corev1.ResourceMemory] = *resource.NewQuantity(int64(memoryMB)<<20, resource.BinarySI)
	}
	if milli := int64(math.Round(cpuCores * 1000)); milli > 0 {
		list[corev1.ResourceCPU] = *resource.NewMilliQuantity(milli, resource.DecimalSI)
	}
	if len(list) == 0 {
		return corev1.ResourceRequirements{}
	}
	return corev1.ResourceRequirements{Requests: list, Limits: list.DeepCopy()}
}
