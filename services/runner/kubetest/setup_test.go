//go:build linux

package kubetest_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
)

// Names on the node.
const (
	namespace  = "agents"
	hostImage  = "local/agent-host:test"
	agentImage = "local/acp-agent:test"
	agentBin   = "/usr/local/bin/acp-agent"
	// workspaceClaim is a PersistentVolumeClaim bound to a hostPath
	// volume of this host's directory env.workspaces: the runner (this
	// test process) and the agents' pods see the same files.
	workspaceClaim = "workspaces"
	// nonroot is the images' user: the executor runs pods as non-root.
	nonroot = "65532:65532"
)

// env is what TestMain set up, for every test.
var env struct {
	node   *kubeenv.KubeNodeEnv
	jaeger *testenv.Jaeger
	// admin is the cluster's admin client; runnerConfig is the runner's
	// ServiceAccount's, bound to the chart's Role.
	admin        kubernetes.Interface
	runnerConfig *rest.Config
	runnerSA     string
	// otlp is Jaeger's OTLP receiver as pods reach it.
	otlp       string
	workspaces string
	// dir holds the run's files (workspaces, images, binaries); setUp
	// removes it at the end.
	dir string
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	code, err := setUp(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetest:", err)
		if env.node != nil {
			fmt.Fprintln(os.Stderr, env.node.Logs())
		}
		code = 1
	}
	if env.node != nil {
		if err := env.node.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "kubetest: stopping the node:", err)
		}
	}
	env.jaeger.Stop()
	os.Exit(code)
}

func setUp(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "runner-kubetest-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	env.dir = dir
	env.workspaces = filepath.Join(dir, "workspaces")
	if err := os.Mkdir(env.workspaces, 0o755); err != nil {
		return 0, err
	}
	images, err := buildImages(ctx, dir)
	if err != nil {
		return 0, err
	}
	if env.node, err = kubeenv.KubeNode(ctx); err != nil {
		return 0, err
	}
	for _, img := range images {
		if err := env.node.ImportImage(ctx, img); err != nil {
			return 0, err
		}
	}
	if env.jaeger, err = testenv.StartJaeger(ctx); err != nil {
		return 0, err
	}
	otlp, err := env.node.Forward(kubeenv.KubeNodeIP+":0", env.jaeger.OTLPEndpoint)
	if err != nil {
		return 0, err
	}
	env.otlp = otlp.Addr().String()
	if env.admin, err = kubernetes.NewForConfig(env.node.Config); err != nil {
		return 0, err
	}
	if err := setUpNamespace(ctx); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// buildImages builds agent-host's image and the example agent's, each a
// static binary on an empty base, run as a non-root user.
func buildImages(ctx context.Context, dir string) ([]string, error) {
	var tarballs []string
	for _, img := range []struct{ ref, pkg, bin string }{
		{hostImage, "./services/runner/cmd/agent-host", "/usr/local/bin/agent-host"},
		{agentImage, "./examples/acp-agent", agentBin},
	} {
		bin := filepath.Join(dir, filepath.Base(img.bin))
		if err := testenv.BuildStatic(ctx, img.pkg, bin); err != nil {
			return nil, err
		}
		tarball := bin + ".tar"
		if err := testenv.WriteImage(tarball, testenv.Image{
			Ref: img.ref, User: nonroot, Entrypoint: []string{img.bin},
			Files: []testenv.ImageFile{{Path: img.bin, HostPath: bin, Mode: 0o755}},
		}); err != nil {
			return nil, err
		}
		tarballs = append(tarballs, tarball)
	}
	return tarballs, nil
}

// setUpNamespace makes the agents' namespace with the chart's Role and
// RoleBinding for the runner's ServiceAccount, and the workspace claim.
func setUpNamespace(ctx context.Context) error {
	if _, err := env.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	role, binding, err := chartRBAC(ctx)
	if err != nil {
		return err
	}
	env.runnerSA = binding.Subjects[0].Name
	if ns := binding.Subjects[0].Namespace; ns != namespace {
		return fmt.Errorf("the chart binds the runner's Role to a ServiceAccount in %q, want the release's namespace %q", ns, namespace)
	}
	if _, err := env.admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: env.runnerSA}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := env.admin.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := env.admin.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return err
	}
	env.runnerConfig = rest.CopyConfig(env.node.Config)
	env.runnerConfig.Impersonate = rest.ImpersonationConfig{UserName: serviceAccountUser(env.runnerSA)}
	// The authorizer learns of the binding through its own watch.
	if err := testenv.Poll(waitTimeout, func() error {
		allowed, err := canI(ctx, env.runnerSA, "create", "batch", "jobs", "", namespace)
		if err == nil && !allowed {
			err = errors.New("not allowed yet")
		}
		return err
	}); err != nil {
		return fmt.Errorf("waiting for the runner's RoleBinding to take effect: %w", err)
	}
	// Pods need their namespace's default ServiceAccount, which the
	// controller-manager makes.
	if err := testenv.Poll(waitTimeout, func() error {
		_, err := env.admin.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("waiting for the namespace's default ServiceAccount: %w", err)
	}

	if err := os.Chmod(env.workspaces, 0o777); err != nil {
		return err
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "kubetest-workspaces"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: env.workspaces}},
		},
	}
	if _, err := env.admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return err
	}
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: workspaceClaim, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: &empty,
			VolumeName:       pv.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := env.admin.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return err
	}
	return nil
}

// chartRBAC renders helm/conclave's runner Role and RoleBinding for the
// agents' namespace.
func chartRBAC(ctx context.Context) (*rbacv1.Role, *rbacv1.RoleBinding, error) {
	helm, err := kubeenv.Helm(ctx)
	if err != nil {
		return nil, nil, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, helm, "template", "kubetest", filepath.Join(root, "helm", "conclave"),
		"--namespace", namespace, "--kube-version", "v1.34.4", "--set", "runner.executor=kubernetes",
		"--show-only", "templates/runner-rbac.yaml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, doc := range strings.Split(string(out), "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			if runtime.IsMissingKind(err) {
				continue
			}
			return nil, nil, fmt.Errorf("the chart's runner RBAC: %w", err)
		}
		switch o := obj.(type) {
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			binding = o
		}
	}
	if role == nil || binding == nil || len(binding.Subjects) != 1 {
		return nil, nil, fmt.Errorf("the chart rendered no runner Role and RoleBinding for one ServiceAccount:\n%s", out)
	}
	return role, binding, nil
}

func serviceAccountUser(name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// freeLoopbackAddr is a loopback address nothing listens on, for a runner
// whose successor must listen where agent-host dials.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
