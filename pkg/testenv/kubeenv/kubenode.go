//go:build linux

package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The node's fixed addresses. They exist only inside the node's own network
// namespace, so they collide with nothing on the host.
const (
	// KubeNodeName is the node's name in the API.
	KubeNodeName = "conclave-node"
	// KubeNodeIP is the node's address: the kubelet serves on it, and pods
	// reach the node (a KubeNodeEnv.Listen listener) on it.
	KubeNodeIP = "10.250.0.1"

	kubeNodePodSubnet  = "10.244.0.0/24"
	kubeNodePodGateway = "10.244.0.1"
	kubeNodeServices   = "10.96.0.0/16"
	kubeNodeAPIServer  = "127.0.0.1:16443"
	// Link names inside the namespace (at most 15 bytes).
	kubeNodeHostBridge = "knhost"
	kubeNodeCNIBridge  = "kn0"

	// PauseImage is the pod sandbox image every KubeNode builds and imports.
	PauseImage = "docker.io/local/pause:1"
)

// kubeNodeRoot holds one directory per running node (its whole state) and
// the lock that lets one node run at a time on this machine.
const kubeNodeRoot = "/tmp/conclave-kubenode"

// kubeNodePath is the PATH the node's daemons run with: containerd finds
// its shim and runc there, the kubelet iptables and mount.
const kubeNodePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// KubeNodeEnv is a real single-node Kubernetes cluster: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet and
// kube-proxy from tools/k8s, with Debian's containerd, runc and CNI
// plugins, all running in a network namespace of their own that KubeNode
// creates. Pods really run. Images come only from ImportImage (pods use
// imagePullPolicy: Never). kube-proxy (iptables mode, its rules inside the
// namespace) routes Services: pods and DialContext reach a Service at its
// ClusterIP, and pods reach the apiserver through the kubernetes Service.
// There is no cluster DNS: address a Service by its ClusterIP (or the
// <NAME>_SERVICE_HOST variables the kubelet gives pods), the node at
// KubeNodeIP.
type KubeNodeEnv struct {
	// Config is an admin (system:masters) client configuration. Its Dial
	// opens connections inside the node's namespace, where the apiserver
	// listens on 127.0.0.1.
	Config *rest.Config
	// Kubeconfig is an admin kubeconfig file. Its server address is only
	// reachable inside the namespace: use it with Command.
	Kubeconfig string
	// NetNS is the network namespace's name (/run/netns/NetNS).
	NetNS string
	// Dir holds the node's state; its logs/ the daemons' output.
	Dir string

	nsFile  *os.File
	lock    *os.File
	daemons []*nodeDaemon

	mu      sync.Mutex
	closers []io.Closer
	once    sync.Once
	stopErr error
}

type nodeDaemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// kubeNodeMu keeps to one node per process: the file lock is per open
// file, so a second node in the same process would wait on itself.
var kubeNodeMu sync.Mutex

// kubeNodeHooks lets this package's tests look at the host right before a
// node changes anything and right after Stop has undone it, both under the
// lock that keeps other nodes away.
var kubeNodeHooks struct {
	beforeStart func()
	afterStop   func()
}

// KubeNode starts a single-node cluster and waits until it can run pods:
// the apiserver is ready, the node is Ready, and the default namespace has
// its ServiceAccount and kube-root-ca.crt. It needs root (network
// namespaces, mounts, cgroups); as another user it returns an error.
//
// Nodes on one machine run one at a time: KubeNode waits (until ctx ends)
// for a node started by another process to stop. Before starting it tears
// down what a crashed test process left behind. The binaries are built
// first if missing (minutes; see Kube) and the Debian packages installed
// with scripts/install-test-deps.sh. Stop it with Stop.
func KubeNode(ctx context.Context) (node *KubeNodeEnv, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("kubeenv: KubeNode needs root: it creates a network namespace, mounts and cgroups (run the tests as root, or with -short)")
	}
	if err := kubeNodePackages(ctx); err != nil {
		return nil, err
	}
	bin, err := testenv.ToolBinaries(ctx, "k8s", "kube-apiserver", "etcd", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy")
	if err != nil {
		return nil, err
	}
	kubeNodeMu.Lock()
	lock, err := lockKubeNodes(ctx)
	if err != nil {
		kubeNodeMu.Unlock()
		return nil, err
	}
	cleanStaleKubeNodes()
	if kubeNodeHooks.beforeStart != nil {
		kubeNodeHooks.beforeStart()
	}

	k := &KubeNodeEnv{lock: lock}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.Stop())
			node = nil
		}
	}()
	if err := k.prepare(); err != nil {
		return k, err
	}
	if err := k.start(ctx, bin); err != nil {
		return k, fmt.Errorf("%w\n%s", err, k.Logs())
	}
	return k, nil
}

// lockKubeNodes takes the machine-wide lock on kubeNodeRoot/.lock,
// waiting for another process's node to stop. The kernel drops it when the
// process dies, so a crashed run never leaves it held.
func lockKubeNodes(ctx context.Context) (*os.File, error) {
	if err := os.MkdirAll(kubeNodeRoot, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(kubeNodeRoot, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	waiting := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("kubeenv: lock %s: %w", f.Name(), err)
		}
		if !waiting {
			waiting = true
			fmt.Fprintln(os.Stderr, "kubeenv: waiting for another test process's KubeNode to stop")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("kubeenv: waiting for another KubeNode: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// kubeNodeCommands are what the node runs besides its own binaries: the
// Debian packages scripts/install-test-deps.sh installs.
var kubeNodeCommands = []string{
	"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "ip", "iptables", "iptables-restore",
	"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback",
}

var kubeNodeDeps struct {
	sync.Once
	err error
}

// kubeNodePackages makes sure kubeNodeCommands are installed, running
// scripts/install-test-deps.sh once when one is missing.
func kubeNodePackages(ctx context.Context) error {
	if len(missingNodeCommands()) == 0 {
		return nil
	}
	kubeNodeDeps.Do(func() {
		root, err := testenv.RepoRoot()
		if err != nil {
			kubeNodeDeps.err = err
			return
		}
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "install-test-deps.sh"))
		if out, err := cmd.CombinedOutput(); err != nil {
			kubeNodeDeps.err = fmt.Errorf("kubeenv: scripts/install-test-deps.sh: %v\n%s", err, out)
		}
	})
	if kubeNodeDeps.err != nil {
		return kubeNodeDeps.err
	}
	if missing := missingNodeCommands(); len(missing) > 0 {
		return fmt.Errorf("kubeenv: KubeNode needs %s (Debian: containerd, containernetworking-plugins, iptables, iproute2, util-linux)", strings.Join(missing, ", "))
	}
	return nil
}

func missingNodeCommands() []string {
	var missing []string
	for _, c := range kubeNodeCommands {
		if filepath.IsAbs(c) {
			if _, err := os.Stat(c); err != nil {
				missing = append(missing, c)
			}
			continue
		}
		if lookPathIn(kubeNodePath, c) == "" {
			missing = append(missing, c)
		}
	}
	return missing
}

func lookPathIn(path, name string) string {
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// prepare makes the state directory and records, before anything on the
// host changes, what Stop (or the next node, after a crash) must restore.
func (k *KubeNodeEnv) prepare() error {
	dir, err := os.MkdirTemp(kubeNodeRoot, "kn-")
	if err != nil {
		return err
	}
	k.Dir = dir
	k.NetNS = "conclave-" + filepath.Base(dir)
	owner, err := processIdentity(os.Getpid())
	if err != nil {
		return err
	}
	rec, err := recordHost(k.NetNS)
	if err != nil {
		return err
	}
	// The owner file goes last: a directory without one was never started
	// and has nothing of the host's to restore.
	if err := rec.write(dir); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "owner"), []byte(owner), 0o600)
}

// processIdentity is a process's pid and start time, which together name
// it even after the pid is reused.
func processIdentity(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// Field 22 (starttime) counts from after the command name, which may
	// hold spaces and parentheses: split after its closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("kubeenv: odd /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return "", fmt.Errorf("kubeenv: odd /proc/%d/stat", pid)
	}
	return fmt.Sprintf("%d %s", pid, fields[19]), nil
}

func (k *KubeNodeEnv) path(elem ...string) string {
	return filepath.Join(append([]string{k.Dir}, elem...)...)
}

// start creates the namespace and runs the daemons, waiting for each stage.
func (k *KubeNodeEnv) start(ctx context.Context, bin string) error {
	for _, d := range []string{"pki", "logs", "pids", "images", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "flex"} {
		if err := os.MkdirAll(k.path(d), 0o700); err != nil {
			return err
		}
	}
	if err := k.network(ctx); err != nil {
		return err
	}
	if err := k.writeConfig(); err != nil {
		return err
	}
	// The pause image builds while containerd starts.
	pause := make(chan error, 1)
	go func() { pause <- k.buildPauseImage(ctx) }()

	if err := k.startDaemon("containerd", "containerd", "--config", k.path("containerd", "config.toml")); err != nil {
		return err
	}
	if err := k.startDaemon("etcd", filepath.Join(bin, "etcd"),
		"--name=conclave-node", "--data-dir="+k.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=conclave-node=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
		// A test cluster's data is thrown away: no fsync, far less disk wait.
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	pki := func(f string) string { return k.path("pki", f) }
	if err := k.startDaemon("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		// Every address of the namespace (and none outside it): clients
		// here use 127.0.0.1, pods the kubernetes Service, which
		// kube-proxy sends to the advertised KubeNodeIP.
		"--bind-address=0.0.0.0", "--secure-port=16443", "--advertise-address="+KubeNodeIP,
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"),
		"--kubelet-client-certificate="+pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority="+pki("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki("sa.pub"), "--service-account-signing-key-file="+pki("sa.key"),
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-cluster-ip-range="+kubeNodeServices, "--allow-privileged=true", "--profiling=false"); err != nil {
		return err
	}
	if err := k.waitFor(ctx, "containerd's socket", func(context.Context) error {
		_, err := os.Stat(k.path("containerd", "containerd.sock"))
		return err
	}); err != nil {
		return err
	}
	if err := <-pause; err != nil {
		return err
	}
	if err := k.ImportImage(ctx, k.path("images", "pause.tar")); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		return err
	}
	if err := k.waitFor(ctx, "the apiserver to be ready", func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	if err := k.startDaemon("kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+k.path("kubeconfigs", "controller-manager.conf"),
		"--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false",
		"--service-account-private-key-file="+pki("sa.key"), "--root-ca-file="+pki("ca.crt"),
		"--use-service-account-credentials=true", "--controllers=*",
		// Else it creates /usr/libexec/kubernetes/kubelet-plugins on the host.
		"--flex-volume-plugin-dir="+k.path("flex")); err != nil {
		return err
	}
	if err := k.startDaemon("kube-scheduler", filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig="+k.path("kubeconfigs", "scheduler.conf"),
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false"); err != nil {
		return err
	}
	if err := k.startDaemon("kubelet", filepath.Join(bin, "kubelet"),
		"--config="+k.path("kubelet-config.yaml"), "--kubeconfig="+k.path("kubeconfigs", "kubelet.conf"),
		"--root-dir="+k.path("kubelet"), "--hostname-override="+KubeNodeName, "--node-ip="+KubeNodeIP, "-v=1"); err != nil {
		return err
	}
	if err := k.startKubeProxy(bin); err != nil {
		return err
	}
	if err := k.waitFor(ctx, "the node to be Ready", func(ctx context.Context) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, KubeNodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("node not Ready")
	}); err != nil {
		return err
	}
	if err := k.waitFor(ctx, "the default ServiceAccount and kube-root-ca.crt", func(ctx context.Context) error {
		if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	return k.waitFor(ctx, "kube-proxy's first sync", k.kubeProxyHealthy)
}

// startKubeProxy runs kube-proxy in iptables mode. Its chains and rules
// (nat and filter KUBE-*) are made by iptables run inside the namespace,
// so they live and die with it, as the kubelet's do. Every setting that
// would reach beyond the namespace is off:
//   - conntrack: no nf_conntrack_max or hashsize (global: the one in
//     /sys/module is the host's), no timeouts;
//   - no localhost NodePorts, which set route_localnet;
//   - oom_score_adj left alone (lowering it needs CAP_SYS_RESOURCE).
//
// --masquerade-all SNATs Service traffic to the node, so a pod that
// reaches another pod on the same bridge through a ClusterIP gets its
// replies back through the node's conntrack, whether or not the host
// loads br_netfilter.
func (k *KubeNodeEnv) startKubeProxy(bin string) error {
	return k.startDaemon("kube-proxy", filepath.Join(bin, "kube-proxy"),
		"--kubeconfig="+k.path("kubeconfigs", "kube-proxy.conf"),
		"--hostname-override="+KubeNodeName, "--proxy-mode=iptables",
		"--cluster-cidr="+kubeNodePodSubnet, "--masquerade-all",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
		"--conntrack-max-per-core=0", "--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0s", "--conntrack-tcp-timeout-close-wait=0s",
		"--iptables-localhost-nodeports=false", "--oom-score-adj=0", "-v=1")
}

// kubeProxyHealthy asks kube-proxy's healthz, which answers 200 once it
// has written its rules.
func (k *KubeNodeEnv) kubeProxyHealthy(ctx context.Context) error {
	// No keep-alive: an idle connection would hold the namespace.
	client := &http.Client{Transport: &http.Transport{DialContext: k.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:10256/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kube-proxy healthz: %s: %s", resp.Status, body)
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "PATH="+kubeNodePath)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubeenv: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// buildPauseImage builds the sandbox image from internal/pause.
func (k *KubeNodeEnv) buildPauseImage(ctx context.Context) error {
	bin := k.path("images", "pause")
	if err := testenv.BuildStatic(ctx, "./pkg/testenv/internal/pause", bin); err != nil {
		return err
	}
	return testenv.WriteImage(k.path("images", "pause.tar"), testenv.Image{
		Ref:        PauseImage,
		Files:      []testenv.ImageFile{{Path: "/pause", HostPath: bin}},
		Entrypoint: []string{"/pause"},
	})
}

// startDaemon runs a daemon inside the namespace with nsenter, which
// changes only the network namespace: `ip netns exec` would also give it
// a mount namespace of its own and a fresh /sys, hiding the cgroup
// hierarchy from the kubelet and its mounts from containerd.
func (k *KubeNodeEnv) startDaemon(name, bin string, args ...string) error {
	logf, err := os.Create(k.path("logs", name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + k.nsPath(), "--", bin}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+kubeNodePath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group; killed with this process if it dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kubeenv: start %s: %w", name, err)
	}
	d := &nodeDaemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	k.daemons = append(k.daemons, d)
	return os.WriteFile(k.path("pids", name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
}

// waitFor polls check until it succeeds, a daemon exits, or two minutes
// (or ctx) pass.
func (k *KubeNodeEnv) waitFor(ctx context.Context, what string, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := check(cctx)
		ccancel()
		if err == nil {
			return nil
		}
		for _, d := range k.daemons {
			select {
			case <-d.done:
				return fmt.Errorf("kubeenv: %s exited while waiting for %s", d.name, what)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeenv: waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Logs is the end of each daemon's log (the whole logs are in Dir/logs),
// for diagnosing a failed start or a pod that does not run.
func (k *KubeNodeEnv) Logs() string {
	var b strings.Builder
	for _, d := range k.daemons {
		data, _ := os.ReadFile(k.path("logs", d.name+".log"))
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s (%s):\n%s\n", d.name, k.path("logs", d.name+".log"), data)
	}
	return b.String()
}

// ImportImage imports a docker-save tarball (as WriteImage and
// go-containerregistry's tarball.WriteToFile write) into the node's
// containerd, where the kubelet finds it: pods name it by its ref with
// imagePullPolicy: Never.
func (k *KubeNodeEnv) ImportImage(ctx context.Context, tarball string) error {
	return run(ctx, "ctr", "--address", k.path("containerd", "containerd.sock"), "--namespace", "k8s.io",
		"images", "import", tarball)
}

// Stop deletes the node's Jobs and pods, stops its daemons and containers,
// and undoes every change it made to the host: mounts, the namespace (and
// with it the bridges, veths, iptables chains and ip_forward inside it),
// the kernel settings the kubelet changed, cgroups and the host
// directories it created. It is safe to call more than once; the error
// says what could not be undone.
func (k *KubeNodeEnv) Stop() error {
	if k == nil {
		return nil
	}
	k.once.Do(func() {
		if k.Config != nil {
			k.deleteWorkloads()
		}
		k.mu.Lock()
		closers := k.closers
		k.closers = nil
		k.mu.Unlock()
		for _, c := range closers {
			_ = c.Close()
		}
		k.stopDaemons("kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager")
		if k.Dir != "" {
			k.removeContainers()
		}
		k.stopDaemons("containerd", "kube-apiserver", "etcd")
		k.mu.Lock()
		if k.nsFile != nil {
			_ = k.nsFile.Close()
			k.nsFile = nil
		}
		k.mu.Unlock()
		if k.Dir != "" {
			k.stopErr = teardownKubeNodeDir(k.Dir)
		}
		if kubeNodeHooks.afterStop != nil {
			kubeNodeHooks.afterStop()
		}
		_ = k.lock.Close()
		kubeNodeMu.Unlock()
	})
	return k.stopErr
}

// deleteWorkloads deletes every Job and pod and waits (a while) for the
// kubelet to stop their containers and sandboxes, which also tears down
// their network through CNI.
func (k *KubeNodeEnv) deleteWorkloads() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		return
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	background := metav1.DeletePropagationBackground
	grace := int64(1)
	for _, ns := range nss.Items {
		_ = cs.BatchV1().Jobs(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{})
		_ = cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return
		}
		if err == nil && len(pods.Items) == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stopDaemons stops the named daemons: SIGTERM, then SIGKILL after 3 s.
// Nothing of theirs needs keeping (etcd's data and containerd's state go
// with the node), so there is no point waiting for a long graceful drain.
func (k *KubeNodeEnv) stopDaemons(names ...string) {
	var wg sync.WaitGroup
	for _, d := range k.daemons {
		for _, n := range names {
			if d.name != n {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
				select {
				case <-d.done:
				case <-time.After(3 * time.Second):
					_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
					<-d.done
				}
			}()
		}
	}
	wg.Wait()
}

// removeContainers kills and deletes whatever containers the kubelet left
// in containerd, so no shim outlives the node.
func (k *KubeNodeEnv) removeContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctr := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", k.path("containerd", "containerd.sock"), "--namespace", "k8s.io"}, args...)...)
		out, _ := cmd.Output()
		return string(out)
	}
	for _, id := range strings.Fields(ctr("tasks", "ls", "-q")) {
		ctr("tasks", "kill", "--signal", "SIGKILL", id)
		ctr("tasks", "delete", "--force", id)
	}
	for _, id := range strings.Fields(ctr("containers", "ls", "-q")) {
		ctr("containers", "delete", id)
	}
}
