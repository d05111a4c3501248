package server

import (
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"
)

// Connections accepted on a listener the server binds probe their peer
// with TCP keepalive on Keepalive's schedule, not Go's default (15s, then 9
// probes 15s apart), so that a peer whose network is gone is dropped
// within about Time+Timeout.
func TestListenerTCPKeepalive(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Name: "keepalive", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Keepalive: Keepalive{Time: 7 * time.Second, Timeout: 20 * time.Second}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.listen(); err != nil {
		t.Fatal(err)
	}
	defer s.grpcListener.Close()
	defer s.httpListener.Close()
	for name, l := range map[string]net.Listener{"gRPC": s.grpcListener, "HTTP": s.httpListener} {
		t.Run(name, func(t *testing.T) { checkKeepalive(t, l) })
	}
}

// checkKeepalive checks the TCP keepalive of a connection l accepts.
func checkKeepalive(t *testing.T, l net.Listener) {
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("the accepted connection is a %T, want a *net.TCPConn", c)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	opts := []struct {
		name       string
		level, opt int
	}{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
	}
	if err := raw.Control(func(fd uintptr) {
		for _, o := range opts {
			v, err := syscall.GetsockoptInt(int(fd), o.level, o.opt)
			if err != nil {
				t.Errorf("%s: %v", o.name, err)
			}
			got[o.name] = v
		}
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 7, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": keepaliveProbes}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %d, want %d", k, got[k], w)
		}
	}
}
