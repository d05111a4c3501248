package server

import (
	"context"
	"net"
	"time"
)

// keepaliveProbes is how many TCP keepalive probes go unanswered before a
// connection is dropped.
const keepaliveProbes = 4

// listenTCP binds addr with TCP keepalive on every connection accepted: a
// first probe after ka.Time of silence, then keepaliveProbes of them over
// ka.Timeout, so that a peer whose host or network is gone is found within
// about ka.Time+ka.Timeout, as gRPC's keepalive finds a hung one (Go's
// defaults would take two and a half minutes).
func listenTCP(addr string, ka Keepalive) (net.Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: net.KeepAliveConfig{
		Enable:   true,
		Idle:     ka.Time,
		Interval: max(ka.Timeout/keepaliveProbes, time.Second),
		Count:    keepaliveProbes,
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
