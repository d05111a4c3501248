//go:build linux

package kubeenv_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
)

// probeImage holds internal/kubeprobe, a static binary that copies files,
// prints its environment and dials addresses, with no shell.
const probeImage = "local/probe:1"

// crashChildEnv makes the test binary, run by TestKubeNode, a test process
// that starts a node, runs a pod, says so, and waits to be killed.
const crashChildEnv = "CONCLAVE_TESTENV_KUBENODE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	os.Exit(m.Run())
}

// crashChild starts a node with a running pod (so containerd's shims, the
// pod's processes and cgroups, the kubelet's sysctls all exist), prints
// "READY <dir>" and waits for its parent to SIGKILL it.
func crashChild() {
	fail := func(err error) {
		fmt.Println("FAILED", err)
		os.Exit(1)
	}
	ctx := context.Background()
	node, err := kubeenv.KubeNode(ctx)
	if err != nil {
		fail(err)
	}
	cs, err := kubernetes.NewForConfig(node.Config)
	if err != nil {
		fail(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "left-running"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: kubeenv.PauseImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		fail(err)
	}
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			fail(err)
		}
		if p.Status.Phase == corev1.PodRunning {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Println("READY", node.Dir)
	select {}
}

// crashNode runs crashChild and kills it once its pod runs, leaving what a
// test process killed mid-run leaves. It returns the node's directory.
func crashNode(t *testing.T) string {
	ctx, cancel := context.WithTimeout(t.Context(), podWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	dir, ok := strings.CutPrefix(strings.TrimSpace(line), "READY ")
	if !ok {
		t.Fatalf("the crashing test process said %q (%v)", line, err)
	}
	return dir
}

// TestKubeNode starts one real node and, on it: a Job whose init container
// copies a binary into an emptyDir for the main container, which sees a
// Secret through secretKeyRef; a pod that dials back to a listener the
// test made inside the node's namespace; a pod that reaches a host
// loopback listener through Forward; a pod, and the test through
// DialContext, that reach another pod at its Service's ClusterIP
// (kube-proxy's rules). After Stop the host must be exactly
// as before, and a crashed run's leftovers must have been cleaned up by
// the start: a node whose test process was killed while a pod ran, and
// planted leftovers.
func TestKubeNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Kubernetes node")
	}
	ctx := t.Context()
	// A run killed before this one (a CI job past its timeout, say) may
	// have left a node on this machine; the host as it should be after
	// every teardown is the host without it.
	if err := kubeenv.CleanStaleKubeNodes(ctx); err != nil {
		t.Fatal(err)
	}
	pristine, err := hostSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	crashed := crashNode(t)
	stale := plantCrashedNode(t, pristine)

	var before, after map[string]string
	var beforeErr, afterErr error
	kubeenv.SetKubeNodeHostHooks(
		func() { before, beforeErr = hostSnapshot() },
		func() { after, afterErr = hostSnapshot() })
	t.Cleanup(func() { kubeenv.SetKubeNodeHostHooks(nil, nil) })

	start := time.Now()
	node, err := kubeenv.KubeNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node up in %s", time.Since(start).Round(100*time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = node.Stop()
		}
	})
	stale.checkGone(t)
	if _, err := os.Stat(crashed); !os.IsNotExist(err) {
		t.Errorf("the killed test process's node %s is still there (%v)", crashed, err)
	}
	if pids := processesNaming(crashed); len(pids) > 0 {
		t.Errorf("the killed test process's node still runs: %v", pids)
	}
	// What the killed process's node changed is undone too.
	compareSnapshots(t, "before the killed test process's node", pristine, "before this node", before)

	images := t.TempDir()
	probe := filepath.Join(images, "kubeprobe")
	if err := testenv.BuildStatic(ctx, "./pkg/testenv/internal/kubeprobe", probe); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(images, "probe.tar")
	if err := testenv.WriteImage(tarball, testenv.Image{
		Ref:        probeImage,
		Files:      []testenv.ImageFile{{Path: "/kubeprobe", HostPath: probe}},
		Entrypoint: []string{"/kubeprobe"},
	}); err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImage(ctx, tarball); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(node.Config)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("CommandRunsInNamespace", func(t *testing.T) {
		out, err := node.Command(ctx, "ip", "-o", "-4", "addr", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if !strings.Contains(string(out), kubeenv.KubeNodeIP+"/32") {
			t.Fatalf("the node address is not among the namespace's:\n%s", out)
		}
	})
	t.Run("pods", func(t *testing.T) {
		t.Run("JobInitContainerAndSecret", func(t *testing.T) {
			t.Parallel()
			testJob(t, node, cs)
		})
		t.Run("PodDialsBackToListener", func(t *testing.T) {
			t.Parallel()
			l, err := node.Listen("tcp", kubeenv.KubeNodeIP+":0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			testPodReachesVia(t, node, cs, "dial-back", l.Addr().String(), l)
		})
		t.Run("PodReachesHostThroughForward", func(t *testing.T) {
			t.Parallel()
			host, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer host.Close()
			fwd, err := node.Forward(kubeenv.KubeNodeIP+":0", host.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer fwd.Close()
			testPodReachesVia(t, node, cs, "forward", fwd.Addr().String(), host)
		})
		t.Run("PodReachesPodThroughService", func(t *testing.T) {
			t.Parallel()
			testService(t, node, cs)
		})
	})

	dir := node.Dir
	stopped = true
	start = time.Now()
	if err := node.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("node stopped in %s", time.Since(start).Round(100*time.Millisecond))
	if beforeErr != nil || afterErr != nil {
		t.Fatalf("host snapshot: before: %v, after: %v", beforeErr, afterErr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the node's directory %s is still there (%v)", dir, err)
	}
	if pids := processesNaming(dir); len(pids) > 0 {
		t.Errorf("processes naming %s still run: %v", dir, pids)
	}
	compareSnapshots(t, "before start", before, "after Stop", after)
}

func compareSnapshots(t *testing.T, aName string, a map[string]string, bName string, b map[string]string) {
	t.Helper()
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if a[k] != b[k] {
			t.Errorf("host %s differs:\n--- %s\n%s\n--- %s\n%s", k, aName, a[k], bName, b[k])
		}
	}
}

func testJob(t *testing.T, node *kubeenv.KubeNodeEnv, cs kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(t.Context(), podWait)
	defer cancel()
	ns := "default"
	secret := "s3cr3t-" + randomHex(t)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-secret"},
		StringData: map[string]string{"token": secret},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	shared := []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-job"},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "probe-job"}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					InitContainers: []corev1.Container{{
						Name: "copy", Image: probeImage, ImagePullPolicy: corev1.PullNever,
						Command:      []string{"/kubeprobe", "copy", "/kubeprobe", "/shared/kubeprobe"},
						VolumeMounts: shared,
					}},
					// The main container's image has no kubeprobe: it runs the
					// copy the init container left in the shared volume.
					Containers: []corev1.Container{{
						Name: "main", Image: kubeenv.PauseImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/shared/kubeprobe", "env", "SECRET_TOKEN"},
						Env: []corev1.EnvVar{{Name: "SECRET_TOKEN", ValueFrom: &corev1.EnvVarSource{
							SecretKeyRef: &corev1.SecretKeySelector{
								LocalObjectReference: corev1.LocalObjectReference{Name: "probe-secret"}, Key: "token",
							},
						}}},
						VolumeMounts: shared,
					}},
					Volumes: []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
	if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		j, err := cs.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%v\n%s", err, diagnose(node, cs, "app=probe-job"))
		}
		if cond(j, batchv1.JobFailed) {
			t.Fatalf("job failed: %+v\n%s", j.Status, podLogs(ctx, cs, ns, "app=probe-job"))
		}
		if cond(j, batchv1.JobComplete) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	logs := podLogs(ctx, cs, ns, "app=probe-job")
	if want := "SECRET_TOKEN=" + secret; !strings.Contains(logs, want) {
		t.Fatalf("the main container's log lacks %q:\n%s", want, logs)
	}
}

func cond(j *batchv1.Job, typ batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// podLogs reads the main container's log of the pods matching selector
// through the API (the apiserver fetches it from the kubelet).
func podLogs(ctx context.Context, cs kubernetes.Interface, ns, selector string) string {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		out, err := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
		fmt.Fprintf(&b, "%s: %s%v\n", p.Name, out, errOrNil(err))
	}
	return b.String()
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// testPodReachesVia runs a pod that dials addr and sends a line, which
// must arrive on l.
func testPodReachesVia(t *testing.T, node *kubeenv.KubeNodeEnv, cs kubernetes.Interface, name, addr string, l net.Listener) {
	ctx, cancel := context.WithTimeout(t.Context(), podWait)
	defer cancel()
	line := name + "-" + randomHex(t)
	got := make(chan string, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer conn.Close()
		s, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			s += " (" + err.Error() + ")"
		}
		got <- strings.TrimSpace(s)
	}()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: probeImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/kubeprobe", "dial", addr, line},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case s := <-got:
			if s != line {
				t.Fatalf("received %q, want %q", s, line)
			}
			return
		case <-ctx.Done():
			t.Fatalf("no connection from the pod: %v\n%s", ctx.Err(), diagnose(node, cs, "app="+name))
		case <-time.After(500 * time.Millisecond):
			p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodFailed {
				t.Fatalf("the pod failed: %s", podLogs(ctx, cs, "default", "app="+name))
			}
		}
	}
}

func randomHex(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// podWait bounds the wait for a pod, only so that a stuck one fails with
// its diagnosis rather than at go test's timeout: a pod runs in seconds.
const podWait = 3 * time.Minute

// diagnose is the state of the pods matching selector, their events, and
// the daemons' logs.
func diagnose(node *kubeenv.KubeNodeEnv, cs kubernetes.Interface, selector string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		fmt.Fprintf(&b, "list pods: %v\n", err)
	} else {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s: %s %+v\n", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		}
	}
	if evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event %s %s: %s %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	b.WriteString(podLogs(ctx, cs, "default", selector))
	b.WriteString(node.Logs())
	return b.String()
}

// crashedNode is what a killed test process leaves: a node directory whose
// owner is dead, its network namespace, a mount under it and a process
// still running.
type crashedNode struct {
	dir, netns string
	proc       *exec.Cmd
}

func plantCrashedNode(t *testing.T, pristine map[string]string) *crashedNode {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(kubeenv.KubeNodeRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(kubeenv.KubeNodeRoot, "kn-")
	if err != nil {
		t.Fatal(err)
	}
	c := &crashedNode{dir: dir, netns: "conclave-" + filepath.Base(dir)}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The records a node writes before changing anything, under the lock,
	// with no other node around: /run/netns as it was before any node.
	runNetNS := "none"
	if pristine["exists /run/netns"] == "true" {
		runNetNS = "dir"
		if strings.Contains(pristine["mounts"], " /run/netns ") {
			runNetNS = "mounted"
		}
	}
	write("netns", c.netns+"\n")
	write("run-netns.orig", runNetNS+"\n")
	write("hostdirs.created", "")
	write("cgroups.created", "")
	write("sysctl.orig", "")
	run("ip", "netns", "add", c.netns)
	if err := os.MkdirAll(filepath.Join(dir, "mnt"), 0o700); err != nil {
		t.Fatal(err)
	}
	run("mount", "-t", "tmpfs", "tmpfs", filepath.Join(dir, "mnt"))
	write("daemon", "")
	c.proc = exec.Command("tail", "-f", filepath.Join(dir, "daemon"))
	if err := c.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.proc.Wait() }()
	write("owner", fmt.Sprintf("%d 0", dead.Process.Pid))
	t.Cleanup(func() {
		_ = c.proc.Process.Kill()
		_ = exec.Command("umount", "-l", filepath.Join(dir, "mnt")).Run()
		_ = exec.Command("ip", "netns", "del", c.netns).Run()
		_ = os.RemoveAll(dir)
	})
	return c
}

func (c *crashedNode) checkGone(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("the crashed node's directory %s is still there (%v)", c.dir, err)
	}
	if _, err := os.Stat("/run/netns/" + c.netns); !os.IsNotExist(err) {
		t.Errorf("the crashed node's namespace %s is still there (%v)", c.netns, err)
	}
	if mountedAt(filepath.Join(c.dir, "mnt")) {
		t.Errorf("the crashed node's mount is still there")
	}
	if pids := processesNaming(c.dir); len(pids) > 0 {
		t.Errorf("the crashed node's processes still run: %v", pids)
	}
}

func mountedAt(path string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == path {
			return true
		}
	}
	return false
}

// processesNaming lists the live processes whose command line names dir.
func processesNaming(dir string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), dir+"/") {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(st), ") Z ") {
			continue // a zombie: dead, waiting for its parent
		}
		pids = append(pids, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return pids
}

var (
	iptablesCounters = regexp.MustCompile(`\[\d+:\d+\]`)
	addrLifetimes    = regexp.MustCompile(`\s*(valid|preferred)_lft \S+`)
)

// hostSnapshot is the host state a node may touch: firewall rules, links,
// addresses, routes, namespaces, mounts, kernel settings, the fixed host
// directories and the top-level cgroups. Counters and lifetimes, which
// move on their own, are left out.
func hostSnapshot() (map[string]string, error) {
	snap := map[string]string{}
	commands := [][]string{
		{"iptables-save"}, {"ip6tables-save"},
		{"ip", "-o", "link", "show"}, {"ip", "-o", "addr", "show"},
		{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"},
		{"ip", "netns", "list"},
	}
	if _, err := exec.LookPath("iptables-legacy-save"); err == nil {
		commands = append(commands, []string{"iptables-legacy-save"}, []string{"ip6tables-legacy-save"})
	}
	for _, c := range commands {
		out, err := exec.Command(c[0], c[1:]...).Output()
		if err != nil {
			return nil, fmt.Errorf("%v: %w", c, err)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "#") {
				continue // iptables-save's dated header and footer
			}
			l = iptablesCounters.ReplaceAllString(l, "")
			l = addrLifetimes.ReplaceAllString(l, "")
			lines = append(lines, l)
		}
		snap[strings.Join(c, " ")] = strings.Join(lines, "\n")
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	snap["mounts"] = string(mounts)
	for _, s := range []string{
		"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
		"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
	} {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return nil, err
		}
		snap["sysctl "+s] = strings.TrimSpace(string(b))
	}
	// What kube-proxy would change if let: the conntrack table's size (the
	// hashsize is global, the max the host namespace's), route_localnet;
	// and br_netfilter's switch, which it reads. Absent without the module.
	for _, f := range []string{
		"/proc/sys/net/netfilter/nf_conntrack_max", "/sys/module/nf_conntrack/parameters/hashsize",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
		"/proc/sys/net/ipv4/conf/all/route_localnet", "/proc/sys/net/bridge/bridge-nf-call-iptables",
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			b = []byte("absent")
		}
		snap[f] = strings.TrimSpace(string(b))
	}
	for _, d := range []string{
		"/run/netns", "/run/containerd", "/run/containerd/s", "/run/containerd/runc", "/var/lib/kubelet",
		"/var/lib/cni", "/var/log/containers", "/usr/libexec/kubernetes", "/opt/containerd",
		"/run/xtables.lock", "/var/lib/kube-proxy",
	} {
		_, err := os.Lstat(d)
		snap["exists "+d] = fmt.Sprint(err == nil)
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/*/")
	snap["cgroups"] = strings.Join(cgroups, "\n")
	return snap, nil
}

// testService runs a relay pod behind a ClusterIP Service and a pod that
// dials the Service's address: the line must pass through kube-proxy's
// rules to the relay, which sends it on to a listener of the test's. Then
// the test itself sends a line to the ClusterIP through DialContext.
func testService(t *testing.T, node *kubeenv.KubeNodeEnv, cs kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(t.Context(), podWait)
	defer cancel()
	l, err := node.Listen("tcp", kubeenv.KubeNodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	labels := map[string]string{"app": "relay"}
	relay := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "relay", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: probeImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/kubeprobe", "relay", ":8080", l.Addr().String()},
			Ports:   []corev1.ContainerPort{{Name: "relay", ContainerPort: 8080}},
			// Ready, and so an endpoint of the Service, once it listens.
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("relay")}},
				PeriodSeconds: 1,
			},
		}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, relay, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "relay"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("relay")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	if !strings.HasPrefix(svc.Spec.ClusterIP, "10.96.") {
		t.Fatalf("ClusterIP %q outside the node's service range 10.96.0.0/16", svc.Spec.ClusterIP)
	}
	testPodReachesVia(t, node, cs, "via-service", addr, l)

	// The test's own connection, made inside the namespace, takes the same
	// rules (the nat table's OUTPUT chain). The rules are in place: the pod
	// just went through them.
	line := "from-test-" + randomHex(t)
	conn, err := node.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial the Service at %s: %v", addr, err)
	}
	if _, err := fmt.Fprintln(conn, line); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	in, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	got, err := bufio.NewReader(in).ReadString('\n')
	if strings.TrimSpace(got) != line {
		t.Fatalf("the relay sent %q (%v), want %q", got, err, line)
	}
}
