//go:build linux

package kubeenv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// kubeNodeSysctls are the global kernel settings the kubelet changes
// (setupKernelTunables). The bridge CNI's net.ipv4.ip_forward is per
// network namespace and goes with the node's.
var kubeNodeSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// kubeNodeHostDirs are host directories at fixed paths that the daemons
// create whatever their configuration says: containerd's shim sockets, the
// kubelet's device plugin socket, libcni's cache, the kubelet's pod log
// links. Stop removes those that were not there before.
var kubeNodeHostDirs = []string{
	"/run/containerd", "/run/containerd/s", "/run/containerd/fifo",
	"/var/lib/kubelet", "/var/lib/kubelet/device-plugins",
	"/var/lib/cni", "/var/log/containers", "/usr/libexec/kubernetes", "/opt/containerd",
}

// hostRecord is what a node must give back to the host, recorded in its
// directory before it changes anything so that the next node can restore
// it after a crash.
type hostRecord struct {
	netns   string
	sysctls map[string]string
	// runNetNS is how /run/netns was: "none", "dir", or "mounted" (`ip
	// netns add` bind-mounts it onto itself when it is not a mount point).
	runNetNS string
	dirs     []string // host directories absent before
	cgroups  []string // kubelet cgroups (…/kubepods) absent before
}

func recordHost(netns string) (*hostRecord, error) {
	r := &hostRecord{netns: netns, sysctls: map[string]string{}}
	for _, s := range kubeNodeSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return nil, err
		}
		r.sysctls[s] = strings.TrimSpace(string(b))
	}
	switch mounted, err := isMountPoint("/run/netns"); {
	case err != nil:
		return nil, err
	case mounted:
		r.runNetNS = "mounted"
	default:
		r.runNetNS = "none"
		if _, err := os.Stat("/run/netns"); err == nil {
			r.runNetNS = "dir"
		}
	}
	for _, d := range kubeNodeHostDirs {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			r.dirs = append(r.dirs, d)
		}
	}
	hierarchies, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	for _, h := range hierarchies {
		p := filepath.Join("/sys/fs/cgroup", h.Name(), "kubepods")
		if _, err := os.Lstat(p); h.IsDir() && errors.Is(err, fs.ErrNotExist) {
			r.cgroups = append(r.cgroups, p)
		}
	}
	return r, nil
}

func (r *hostRecord) write(dir string) error {
	var sysctls []string
	for _, s := range kubeNodeSysctls {
		sysctls = append(sysctls, s+" "+r.sysctls[s])
	}
	for name, lines := range map[string][]string{
		"netns":            {r.netns},
		"sysctl.orig":      sysctls,
		"run-netns.orig":   {r.runNetNS},
		"hostdirs.created": r.dirs,
		"cgroups.created":  r.cgroups,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func readHostRecord(dir string) *hostRecord {
	lines := func(name string) []string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	r := &hostRecord{sysctls: map[string]string{}, dirs: lines("hostdirs.created"), cgroups: lines("cgroups.created")}
	if l := lines("netns"); len(l) == 1 {
		r.netns = l[0]
	}
	if l := lines("run-netns.orig"); len(l) == 1 {
		r.runNetNS = l[0]
	}
	for _, l := range lines("sysctl.orig") {
		if k, v, ok := strings.Cut(l, " "); ok {
			r.sysctls[k] = v
		}
	}
	return r
}

// cleanStaleKubeNodes tears down the nodes of test processes that died
// without stopping them. It runs under the lock, so no other node is
// starting or stopping meanwhile.
func cleanStaleKubeNodes() {
	entries, err := os.ReadDir(kubeNodeRoot)
	if err != nil {
		return
	}
	self, _ := processIdentity(os.Getpid())
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "kn-") {
			continue
		}
		dir := filepath.Join(kubeNodeRoot, e.Name())
		owner, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			// Never started: prepare writes the owner before any host change.
			_ = os.RemoveAll(dir)
			continue
		}
		pid, _, _ := strings.Cut(string(owner), " ")
		n, _ := strconv.Atoi(pid)
		if alive, _ := processIdentity(n); alive == string(owner) && alive != self {
			fmt.Fprintf(os.Stderr, "kubeenv: KubeNode %s belongs to the live process %d: left alone\n", dir, n)
			continue
		}
		fmt.Fprintf(os.Stderr, "kubeenv: tearing down KubeNode %s left by a crashed test process (%s)\n", dir, pid)
		if err := teardownKubeNodeDir(dir); err != nil {
			fmt.Fprintf(os.Stderr, "kubeenv: %v\n", err)
		}
	}
}

// teardownKubeNodeDir undoes everything a node did to the host, from what
// its directory records, and removes the directory. Stop runs it after
// stopping the daemons gracefully; after a crash it also ends what is
// still running.
func teardownKubeNodeDir(dir string) error {
	r := readHostRecord(dir)
	var errs []error
	killKubeNodeProcesses(dir, r.cgroups)

	// The kubelet's bind of its root dir and its tmpfs volumes, containerd's
	// overlay rootfs and shm, the pinned pod network namespaces.
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	// Deleting the namespace takes its links, pod veths, iptables chains and
	// ip_forward with it (once no socket or process holds it).
	if r.netns != "" {
		p := "/run/netns/" + r.netns
		if _, err := os.Lstat(p); err == nil {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if r.runNetNS == "none" || r.runNetNS == "dir" {
		if left, err := os.ReadDir("/run/netns"); err == nil && len(left) == 0 {
			if mounted, _ := isMountPoint("/run/netns"); mounted {
				if err := unix.Unmount("/run/netns", unix.MNT_DETACH); err != nil {
					errs = append(errs, fmt.Errorf("unmount /run/netns: %w", err))
				}
			}
			if r.runNetNS == "none" {
				if err := os.Remove("/run/netns"); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, s := range kubeNodeSysctls {
		if v, ok := r.sysctls[s]; ok {
			if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
			}
		}
	}
	// Pod log links the kubelet wrote into /var/log/containers.
	if links, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, l := range links {
			p := filepath.Join("/var/log/containers", l.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
				_ = os.Remove(p)
			}
		}
	}
	for i := len(r.dirs) - 1; i >= 0; i-- {
		if err := os.RemoveAll(r.dirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, cg := range r.cgroups {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubeenv: KubeNode teardown of %s: %w", dir, err)
	}
	return nil
}

// killKubeNodeProcesses kills what a node runs: every process whose
// command line names its directory (the daemons, containerd's shims) and
// every process in the kubelet cgroups it created (the containers), and
// waits for them to go.
func killKubeNodeProcesses(dir string, cgroups []string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := map[int]bool{}
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			if err == nil && strings.Contains(string(cmdline), dir+"/") {
				pids[pid] = true
			}
		}
		for _, cg := range cgroups {
			_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(path)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
						pids[pid] = true
					}
				}
				return nil
			})
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mountPoints lists the mount table's mount points, in order.
func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			points = append(points, unescapeMount(fields[4]))
		}
	}
	return points, sc.Err()
}

// unescapeMount undoes the mount table's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isMountPoint(path string) (bool, error) {
	points, err := mountPoints()
	if err != nil {
		return false, err
	}
	for _, p := range points {
		if p == path {
			return true, nil
		}
	}
	return false, nil
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	for range 5 {
		points, err := mountPoints()
		if err != nil {
			return err
		}
		var under []string
		for _, p := range points {
			if p == dir || strings.HasPrefix(p, dir+"/") {
				under = append(under, p)
			}
		}
		if len(under) == 0 {
			return nil
		}
		sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
		for _, p := range under {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	return fmt.Errorf("mounts remain under %s", dir)
}

// removeCgroup removes a cgroup directory and those below it, deepest
// first; a cgroup whose last process just died may stay busy a moment.
func removeCgroup(root string) error {
	if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var err error
	for _, d := range dirs {
		for range 50 {
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	return nil
}
