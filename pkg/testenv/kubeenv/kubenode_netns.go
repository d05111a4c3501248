//go:build linux

package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

func (k *KubeNodeEnv) nsPath() string { return "/run/netns/" + k.NetNS }

// network creates the namespace with loopback up and the node address on
// a bridge of its own (the kubelet refuses a loopback node address). The
// Service range is routed to that bridge: a connection made in the
// namespace itself (DialContext, helm) to a ClusterIP needs a route before
// kube-proxy's OUTPUT rule rewrites it to a pod, and the namespace has no
// default route. Pods need none: their traffic is rewritten on arrival.
func (k *KubeNodeEnv) network(ctx context.Context) error {
	if err := run(ctx, "ip", "netns", "add", k.NetNS); err != nil {
		return err
	}
	f, err := os.Open(k.nsPath())
	if err != nil {
		return err
	}
	k.nsFile = f
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", kubeNodeHostBridge, "type", "bridge"},
		{"addr", "add", KubeNodeIP + "/32", "dev", kubeNodeHostBridge},
		{"link", "set", kubeNodeHostBridge, "up"},
		{"route", "add", kubeNodeServices, "dev", kubeNodeHostBridge},
	} {
		if err := run(ctx, "ip", append([]string{"-n", k.NetNS}, args...)...); err != nil {
			return err
		}
	}
	return nil
}

// inNetNS runs fn on a thread that has joined the node's network
// namespace, so the sockets fn creates live there (a socket keeps the
// namespace it was created in). The thread then goes back to this
// process's namespace before it returns to the runtime. It must never just
// end locked (which would discard it): a child started with Pdeathsig from
// that thread earlier, by this package or any other, would be killed.
func (k *KubeNodeEnv) inNetNS(fn func()) error {
	home, err := hostNetNS()
	if err != nil {
		return err
	}
	k.mu.Lock()
	f := k.nsFile
	k.mu.Unlock()
	if f == nil {
		return errors.New("kubeenv: the KubeNode is stopped")
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("kubeenv: join network namespace: %w", err)
			return
		}
		fn()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			errc <- nil
			// Stuck in the node's namespace: keep the thread from every
			// other goroutine, and alive, for good.
			select {}
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

var hostNS struct {
	sync.Once
	fd  int
	err error
}

// hostNetNS is this process's own network namespace. /proc/self names the
// main thread, which never leaves it.
func hostNetNS() (int, error) {
	hostNS.Do(func() {
		hostNS.fd, hostNS.err = unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	})
	return hostNS.fd, hostNS.err
}

// nsAddr checks that addr names an IP address: inside the namespace there
// is no resolver to ask for a host name ("localhost" is 127.0.0.1).
func nsAddr(network, addr string) (string, error) {
	if strings.HasPrefix(network, "unix") {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if host != "" && net.ParseIP(host) == nil {
		return "", fmt.Errorf("kubeenv: %q: inside the node's namespace, address by IP, not host name", addr)
	}
	return net.JoinHostPort(host, port), nil
}

// DialContext connects to addr (IP:port) from inside the node's network
// namespace: 127.0.0.1 there is the node's loopback (the apiserver on
// 127.0.0.1:16443), and pods are reachable at their pod IPs. Config uses it.
func (k *KubeNodeEnv) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	addr, err := nsAddr(network, addr)
	if err != nil {
		return nil, err
	}
	var conn net.Conn
	if err := k.inNetNS(func() {
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
	}); err != nil {
		return nil, err
	}
	return conn, err
}

// Listen listens on addr inside the node's network namespace, e.g. on
// KubeNodeIP+":0", where pods can connect to it. Accept and the accepted
// connections work from any goroutine.
func (k *KubeNodeEnv) Listen(network, addr string) (net.Listener, error) {
	addr, err := nsAddr(network, addr)
	if err != nil {
		return nil, err
	}
	var l net.Listener
	if err := k.inNetNS(func() {
		l, err = net.Listen(network, addr)
	}); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("kubeenv: listen on %s inside the node's namespace: %w", addr, err)
	}
	return l, nil
}

// Forward listens on nsAddr inside the node's namespace and relays each
// connection to hostAddr on this host (in the test process's namespace),
// so pods can reach a host loopback service, such as Jaeger's OTLP port,
// at KubeNodeIP. Close the returned listener to stop accepting; Stop
// closes it too.
func (k *KubeNodeEnv) Forward(nsAddr, hostAddr string) (net.Listener, error) {
	l, err := k.Listen("tcp", nsAddr)
	if err != nil {
		return nil, err
	}
	k.relayFrom(l, func() (net.Conn, error) { return net.DialTimeout("tcp", hostAddr, 10*time.Second) })
	return l, nil
}

// Expose is Forward the other way: it listens on a free port of this
// host's loopback and relays each connection to addr (IP:port) inside
// the node's namespace: a Service's ClusterIP, say, so that programs the
// test runs on the host (a command line client, an agent) reach it as
// they would reach a service on this machine. It returns the loopback
// address. Stop closes the listener.
func (k *KubeNodeEnv) Expose(addr string) (string, error) {
	target, err := nsAddr("tcp", addr)
	if err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	k.relayFrom(l, func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return k.DialContext(ctx, "tcp", target)
	})
	return l.Addr().String(), nil
}

// relayFrom relays each connection l accepts to one dial opens, until l is
// closed, which Stop does.
func (k *KubeNodeEnv) relayFrom(l net.Listener, dial func() (net.Conn, error)) {
	k.mu.Lock()
	k.closers = append(k.closers, l)
	k.mu.Unlock()
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go relay(in, dial)
		}
	}()
}

// ServeHTTP serves h inside the node's namespace, on KubeNodeIP and a
// free port, where pods reach it, and returns its base URL
// ("http://10.250.0.1:port"). Stop closes it.
func (k *KubeNodeEnv) ServeHTTP(h http.Handler) (string, error) {
	l, err := k.Listen("tcp", KubeNodeIP+":0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	k.mu.Lock()
	k.closers = append(k.closers, srv)
	k.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), nil
}

func relay(in net.Conn, dial func() (net.Conn, error)) {
	defer in.Close()
	out, err := dial()
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, in)
		if c, ok := out.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		close(done)
	}()
	_, _ = io.Copy(in, out)
	if c, ok := in.(*net.TCPConn); ok {
		_ = c.CloseWrite()
	}
	<-done
}

// Command prepares a command that runs inside the node's network namespace
// (and nothing else of it), with KUBECONFIG set to Kubeconfig: for
// kubectl, helm and other command line clients.
func (k *KubeNodeEnv) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + k.nsPath(), "--", name}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.Kubeconfig)
	return cmd
}
