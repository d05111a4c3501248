package kubeenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Release is a Helm release of a chart on a KubeNode, the way the tests
// that install helm/conclave (deploy/kubetest, e2e's Kubernetes shape)
// drive it: helm run inside the node's namespace, and waits on its
// Deployments through client-go.
type Release struct {
	Node      *KubeNodeEnv
	Client    kubernetes.Interface
	Name      string
	Namespace string

	helm string
	// home holds helm's cache, config and data, away from $HOME.
	home string
}

// NewRelease prepares release name in namespace on node: it finds (or
// builds) helm, and keeps helm's own files under dir.
func NewRelease(ctx context.Context, node *KubeNodeEnv, name, namespace, dir string) (*Release, error) {
	helm, err := Helm(ctx)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(node.Config)
	if err != nil {
		return nil, err
	}
	return &Release{Node: node, Client: client, Name: name, Namespace: namespace, helm: helm, home: filepath.Join(dir, "helm")}, nil
}

// Helm runs helm with args inside the node's namespace (where the
// apiserver is) and returns its output.
func (r *Release) Helm(ctx context.Context, args ...string) (string, error) {
	cmd := r.Node.Command(ctx, r.helm, args...)
	cmd.Env = append(cmd.Env,
		"HELM_CACHE_HOME="+filepath.Join(r.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(r.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(r.home, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// CreateSecrets creates the release's namespace and the Secrets named, each
// from its string data, as an operator does before `helm install`.
func (r *Release) CreateSecrets(ctx context.Context, secrets map[string]map[string]string) error {
	if _, err := r.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for name, data := range secrets {
		if _, err := r.Client.CoreV1().Secrets(r.Namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: data,
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// WaitRolledOut waits until Deployment name has every replica updated,
// Ready and available, no other pods, and (unless notHash is empty) its
// pods are of a pod template other than notHash. It returns the pods'
// pod-template-hash; when ctx ends first, the error says what was
// missing.
func (r *Release) WaitRolledOut(ctx context.Context, name, notHash string) (string, error) {
	for {
		hash, err := r.RolledOut(ctx, name)
		if err == nil && hash != notHash {
			return hash, nil
		}
		if err == nil {
			err = fmt.Errorf("still on pod template %s", hash)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("deployment %s not rolled out: %w", name, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitServing waits until every port of Service name accepts a TCP
// connection at its cluster IP, dialled from the node's namespace. A
// rolled-out Deployment is not yet a reachable Service: kube-proxy
// programs the new endpoints a moment after the pods turn Ready, and
// until then a connection is refused.
func (r *Release) WaitServing(ctx context.Context, name string) error {
	svc, err := r.Client.CoreV1().Services(r.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, p := range svc.Spec.Ports {
		addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(p.Port)))
		for {
			conn, err := r.Node.DialContext(ctx, "tcp", addr)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("service %s port %s (%s) never accepted a connection: %w", name, p.Name, addr, err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// RolledOut checks Deployment name's rollout is complete: the controller
// has seen its spec, its replicas are all updated, Ready and available,
// no old pod remains, and every pod of it is Ready. It returns the pods'
// pod-template-hash.
func (r *Release) RolledOut(ctx context.Context, name string) (string, error) {
	d, err := r.Client.AppsV1().Deployments(r.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	want := *d.Spec.Replicas
	s := d.Status
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return "", fmt.Errorf("generation %d observed %d; replicas %d: updated %d, ready %d, available %d, total %d",
			d.Generation, s.ObservedGeneration, want, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas, s.Replicas)
	}
	pods, err := r.Pods(ctx, d)
	if err != nil {
		return "", err
	}
	if int32(len(pods)) != want {
		return "", fmt.Errorf("%d pods, want %d", len(pods), want)
	}
	hash := ""
	for _, p := range pods {
		if !PodReady(&p) {
			return "", fmt.Errorf("pod %s not Ready", p.Name)
		}
		h := p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
		if hash != "" && h != hash {
			return "", fmt.Errorf("pods of two templates, %s and %s", hash, h)
		}
		hash = h
	}
	return hash, nil
}

// Pods lists a Deployment's pods (those its selector matches, not being
// deleted).
func (r *Release) Pods(ctx context.Context, d *appsv1.Deployment) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	list, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// PodReady reports whether p's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ServiceAddr is Service name's ClusterIP and its port called port, as
// pods and KubeNodeEnv.DialContext and Expose reach it.
func (r *Release) ServiceAddr(ctx context.Context, name, port string) (string, error) {
	svc, err := r.Client.CoreV1().Services(r.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == port {
			return fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, p.Port), nil
		}
	}
	return "", fmt.Errorf("service %s has no port %q", name, port)
}

// PodLog is a container's log (or what kept it from being read).
func (r *Release) PodLog(pod, container string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := r.Client.CoreV1().Pods(r.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// Logs is the logs of the pods whose labels match selector, each headed
// by its pod's and container's name: a failing test's report.
func (r *Release) Logs(selector string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			fmt.Fprintf(&b, "--- pod %s, container %s\n%s", p.Name, c.Name, r.PodLog(p.Name, c.Name))
		}
	}
	return b.String()
}

// Diagnose is the namespace's pods (with each container's state and the
// last 3,000 bytes of its log), its events, and the node's daemons' logs.
func (r *Release) Diagnose() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(&b, "list pods: %v\n", err)
	} else {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s: %s ready=%v\n", p.Name, p.Status.Phase, PodReady(&p))
			for _, c := range p.Status.ContainerStatuses {
				fmt.Fprintf(&b, "  container %s: ready=%v restarts=%d state=%+v last=%+v\n", c.Name, c.Ready, c.RestartCount, c.State, c.LastTerminationState)
				log := r.PodLog(p.Name, c.Name)
				if len(log) > 3000 {
					log = log[len(log)-3000:]
				}
				fmt.Fprintf(&b, "  log:\n%s\n", log)
			}
		}
	}
	if evs, err := r.Client.CoreV1().Events(r.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, ev := range evs.Items {
			fmt.Fprintf(&b, "event %s %s: %s %s\n", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
		}
	}
	b.WriteString(r.Node.Logs())
	return b.String()
}

// ServiceAccountCan asks the API server (a SubjectAccessReview) whether
// ServiceAccount sa of namespace may do what attrs says: verb on
// group/resource[/subresource] in attrs.Namespace ("" cluster-wide).
func ServiceAccountCan(ctx context.Context, client kubernetes.Interface, namespace, sa string, attrs authorizationv1.ResourceAttributes) (bool, error) {
	sar, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + namespace + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &attrs,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}

// ChartVersion is helm/conclave's appVersion: the tag of the images
// ConclaveImages builds, which the chart runs by default.
func ChartVersion() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, "helm", "conclave", "Chart.yaml"))
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`), nil
		}
	}
	return "", errors.New("kubeenv: helm/conclave/Chart.yaml has no appVersion")
}
