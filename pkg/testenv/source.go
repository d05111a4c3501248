package testenv

import (
	"context"
	"net"
	"net/http"
)

// OtherLoopback is a loopback address other than 127.0.0.1, for a second
// caller in tests of per-address limits: Linux routes all of 127.0.0.0/8
// to the loopback interface, so a connection can come from it to a server
// on 127.0.0.1.
const OtherLoopback = "127.0.0.2"

// DialFrom dials from the address ip (no port), e.g. OtherLoopback.
func DialFrom(ip string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return d.DialContext
}

// ClientFrom is an HTTP client whose connections come from ip.
func ClientFrom(ip string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: DialFrom(ip)}}
}
