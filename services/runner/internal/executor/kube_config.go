package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeConfig is the Kubernetes executor's part of the runner's
// configuration, meant to be embedded (untagged) in service.Config. Its
// Validate checks only the form of what is set, since it runs whichever
// executor is chosen; NewKubernetes checks that what the executor needs is
// there.
type KubeConfig struct {
	Kubeconfig      string        `env:"CONCLAVE_RUNNER_KUBE_KUBECONFIG" help:"kubeconfig file for the Kubernetes executor (default: the in-cluster service account)"`
	Namespace       string        `env:"CONCLAVE_RUNNER_KUBE_NAMESPACE" help:"namespace the Kubernetes executor runs agents' Jobs in (default: the runner's own, from its service account)"`
	HostImage       string        `env:"CONCLAVE_RUNNER_KUBE_HOST_IMAGE" help:"image holding the agent-host binary, copied into every agent's pod by an init container"`
	HostBinary      string        `env:"CONCLAVE_RUNNER_KUBE_HOST_BINARY" default:"/usr/local/bin/agent-host" help:"path of the agent-host binary inside CONCLAVE_RUNNER_KUBE_HOST_IMAGE (make images puts it here)"`
	ImagePullPolicy string        `env:"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY" default:"IfNotPresent" help:"imagePullPolicy of agent and agent-host containers: Always, IfNotPresent or Never"`
	ServiceAccount  string        `env:"CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT" help:"ServiceAccount agents' pods run as (its token is never mounted; default: the namespace's default)"`
	RunAsNonRoot    bool          `env:"CONCLAVE_RUNNER_KUBE_RUN_AS_NON_ROOT" default:"true" help:"refuse to start agent and agent-host containers whose image runs as root (their images need a numeric non-root USER)"`
	WorkspaceClaim  string        `env:"CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM" help:"PersistentVolumeClaim holding the workspaces (default: none, each agent gets an empty throwaway emptyDir)"`
	WorkspaceRoot   string        `env:"CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT" help:"where the runner mounts CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM: a launch's workspace_path below it is mounted as that subPath of the claim"`
	WorkspaceMount  string        `env:"CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT" default:"/workspace" help:"where the workspace is mounted in the agent's container, and its working directory (an agent type's working_dir overrides it)"`
	TTLAfterFinish  time.Duration `env:"CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED" default:"10m" help:"how long a finished agent Job, its pod and Secret are kept (ttlSecondsAfterFinished) before Kubernetes deletes them"`
	StartGrace      time.Duration `env:"CONCLAVE_RUNNER_KUBE_START_GRACE" default:"2m" help:"how long an agent's pod may fail to start its image (ErrImagePull, ImagePullBackOff, CreateContainerConfigError...) before the launch fails"`
	// GatewayTokenSecret is the operator's Secret, in the agents'
	// namespace, that agent-host takes its gateway token from: the runner
	// never reads it, and a launch cannot name another.
	GatewayTokenSecret string   `env:"CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET" help:"Secret in CONCLAVE_RUNNER_KUBE_NAMESPACE holding the bearer token agent-host presents to the gateway when it registers an agent there (CONCLAVE_RUNNER_HOST_GATEWAY_ADDR); empty: none is presented"`
	GatewayTokenKey    string   `env:"CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_KEY" default:"gateway-token" help:"the key of CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET holding the token"`
	SecretEnv          []string `env:"CONCLAVE_RUNNER_KUBE_SECRET_ENV" default:"*_AUTH,*_TOKEN,*_KEY" help:"comma-separated glob patterns of env names whose values go in the launch's Secret, never in the Job spec"`
}

// Validate implements config.Validator.
func (c KubeConfig) Validate() error {
	if c.Namespace != "" {
		if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_NAMESPACE: %q: %s", c.Namespace, strings.Join(errs, "; "))
		}
	}
	switch corev1.PullPolicy(c.ImagePullPolicy) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY: %q is not Always, IfNotPresent or Never", c.ImagePullPolicy)
	}
	if c.ServiceAccount != "" {
		if errs := validation.IsDNS1123Subdomain(c.ServiceAccount); len(errs) > 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_SERVICE_ACCOUNT: %q: %s", c.ServiceAccount, strings.Join(errs, "; "))
		}
	}
	if c.GatewayTokenSecret != "" {
		if errs := validation.IsDNS1123Subdomain(c.GatewayTokenSecret); len(errs) > 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET: %q: %s", c.GatewayTokenSecret, strings.Join(errs, "; "))
		}
		if errs := validation.IsConfigMapKey(c.GatewayTokenKey); len(errs) > 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_KEY: %q: %s", c.GatewayTokenKey, strings.Join(errs, "; "))
		}
	}
	if c.WorkspaceClaim != "" {
		if errs := validation.IsDNS1123Subdomain(c.WorkspaceClaim); len(errs) > 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM: %q: %s", c.WorkspaceClaim, strings.Join(errs, "; "))
		}
		if !filepath.IsAbs(c.WorkspaceRoot) {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT: must be the absolute path the runner mounts CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM at, got %q", c.WorkspaceRoot)
		}
	}
	for key, p := range map[string]string{
		"CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT": c.WorkspaceMount,
		"CONCLAVE_RUNNER_KUBE_HOST_BINARY":     c.HostBinary,
	} {
		if p != "" && (!path.IsAbs(p) || path.Clean(p) != p) {
			return fmt.Errorf("%s: must be a clean absolute path, got %q", key, p)
		}
	}
	if c.WorkspaceMount == hostBinDir || c.WorkspaceMount == "/" {
		return fmt.Errorf("CONCLAVE_RUNNER_KUBE_WORKSPACE_MOUNT: %q is reserved", c.WorkspaceMount)
	}
	if c.TTLAfterFinish < 0 || c.TTLAfterFinish > 365*24*time.Hour {
		return fmt.Errorf("CONCLAVE_RUNNER_KUBE_TTL_AFTER_FINISHED: must be 0..8760h, got %s", c.TTLAfterFinish)
	}
	if c.StartGrace < 0 {
		return fmt.Errorf("CONCLAVE_RUNNER_KUBE_START_GRACE: must not be negative, got %s", c.StartGrace)
	}
	for _, p := range c.SecretEnv {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_SECRET_ENV: %q: %w", p, err)
		}
	}
	return nil
}

// withDefaults fills what a KubeConfig built in code, not by config.Load,
// may leave empty.
func (c KubeConfig) withDefaults() KubeConfig {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = string(corev1.PullIfNotPresent)
	}
	if c.HostBinary == "" {
		c.HostBinary = "/usr/local/bin/agent-host"
	}
	if c.WorkspaceMount == "" {
		c.WorkspaceMount = "/workspace"
	}
	if c.GatewayTokenKey == "" {
		c.GatewayTokenKey = "gateway-token"
	}
	return c
}

// check is Validate plus what the executor cannot run without.
func (c KubeConfig) check() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Namespace == "" {
		return errors.New("CONCLAVE_RUNNER_KUBE_NAMESPACE: the Kubernetes executor needs a namespace")
	}
	if c.HostImage == "" {
		return errors.New("CONCLAVE_RUNNER_KUBE_HOST_IMAGE: the Kubernetes executor needs the agent-host image")
	}
	return nil
}

// RESTConfig is the client configuration: from Kubeconfig when set, else
// the pod's in-cluster service account.
func (c KubeConfig) RESTConfig() (*rest.Config, error) {
	if c.Kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("CONCLAVE_RUNNER_KUBE_KUBECONFIG: %w", err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes executor outside a cluster needs CONCLAVE_RUNNER_KUBE_KUBECONFIG: %w", err)
	}
	return cfg, nil
}

// NewKubernetesFromConfig is NewKubernetes with a client built from cfg:
// RESTConfig, and the runner's own namespace when cfg.Namespace is unset.
func NewKubernetesFromConfig(cfg KubeConfig, logger *slog.Logger) (*Kubernetes, error) {
	rc, err := cfg.RESTConfig()
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "conclave-runner"
	// client-go's default, 5 a second, would pace a burst of launches
	// (two or three calls each) behind one another.
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 20, 40
	}
	if cfg.Namespace == "" {
		if cfg.Namespace, err = ServiceAccountNamespace(); err != nil {
			return nil, err
		}
	}
	client, err := NewKubeClient(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return NewKubernetes(cfg, client, logger)
}

// serviceAccountNamespaceFile is where a pod finds its own namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ServiceAccountNamespace is the namespace of the pod the runner runs in,
// for a KubeConfig whose Namespace is unset.
func ServiceAccountNamespace() (string, error) {
	b, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return "", fmt.Errorf("CONCLAVE_RUNNER_KUBE_NAMESPACE is unset and the runner's own namespace is unknown: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
