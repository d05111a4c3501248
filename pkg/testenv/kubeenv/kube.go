package kubeenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeEnv is a running Kubernetes control plane: a real kube-apiserver backed
// by a real etcd, started through controller-runtime's envtest. It has no
// controller manager, scheduler or kubelet: objects are stored and served,
// and nothing acts on them (a Job gets no Pods).
type KubeEnv struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file holding Config, for command
	// line clients such as helm (--kubeconfig) and KUBECONFIG.
	Kubeconfig string

	env    *envtest.Environment
	dir    string
	output *testenv.LockedBuffer
	once   sync.Once
}

// Kube starts kube-apiserver and etcd from .cache/bin on free loopback ports,
// building them first with scripts/build-test-tools.sh when they are missing
// or tools/k8s changed. That first build takes many minutes and ends early
// only if ctx does: pass a context that lives as long as the test (t.Context())
// and run with a -timeout above go test's default 10m, as `make test` does.
// After the build, starting takes at most 2 minutes or until ctx's deadline.
func Kube(ctx context.Context) (*KubeEnv, error) {
	bin, err := testenv.ToolBinaries(ctx, "k8s", "kube-apiserver", "etcd")
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testenv-kube-")
	if err != nil {
		return nil, err
	}
	out := &testenv.LockedBuffer{}
	timeout := 2 * time.Minute
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), time.Second)
	}
	noExisting := false
	env := &envtest.Environment{
		// Never a cluster named by USE_EXISTING_CLUSTER: tests own theirs.
		UseExistingCluster:       &noExisting,
		BinaryAssetsDirectory:    bin,
		ControlPlaneStartTimeout: timeout,
		ControlPlaneStopTimeout:  time.Minute,
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{Out: out, Err: out},
			Etcd:      &envtest.Etcd{Out: out, Err: out},
		},
	}
	// KUBEBUILDER_ASSETS would override BinaryAssetsDirectory; these paths
	// are the pinned builds, whatever the environment says.
	env.ControlPlane.APIServer.Path = filepath.Join(bin, "kube-apiserver")
	env.ControlPlane.Etcd.Path = filepath.Join(bin, "etcd")

	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("kubeenv: start kube-apiserver and etcd: %w\n%s", err, out)
	}
	k := &KubeEnv{Config: cfg, Kubeconfig: filepath.Join(dir, "kubeconfig"), env: env, dir: dir, output: out}
	if err := os.WriteFile(k.Kubeconfig, env.KubeConfig, 0o600); err != nil {
		k.Stop()
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		k.Stop()
		return nil, err
	}
	return k, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (k *KubeEnv) Stop() {
	if k == nil {
		return
	}
	k.once.Do(func() {
		_ = k.env.Stop()
		_ = os.RemoveAll(k.dir)
	})
}

// Output is what kube-apiserver and etcd have printed so far, for diagnosing
// failures.
func (k *KubeEnv) Output() string { return k.output.String() }

// Helm returns the path of the pinned helm binary, building it first with
// scripts/build-test-tools.sh when it is missing or tools/helm changed.
// Point it at a KubeEnv with --kubeconfig KubeEnv.Kubeconfig.
func Helm(ctx context.Context) (string, error) {
	bin, err := testenv.ToolBinaries(ctx, "helm", "helm")
	if err != nil {
		return "", err
	}
	return filepath.Join(bin, "helm"), nil
}
