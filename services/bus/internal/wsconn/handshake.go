package wsconn

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/gobwas/ws"

	"github.com/conclave-ai/conclave/pkg/server"
)

// checkUpgrade checks a WebSocket opening handshake (RFC 6455 section 4.2.1)
// before the connection is taken from net/http, so that a refusal is an
// HTTP answer in the bus's one JSON error shape. It returns the status and
// message to answer with, or 0.
func checkUpgrade(w http.ResponseWriter, r *http.Request) (int, string) {
	switch {
	case !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket"):
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		return http.StatusUpgradeRequired, "bus: this endpoint speaks WebSocket; send a WebSocket upgrade"
	case r.Method != http.MethodGet:
		w.Header().Set("Allow", http.MethodGet)
		return http.StatusMethodNotAllowed, "bus: a WebSocket upgrade is a GET request"
	case r.ProtoMajor != 1 || r.ProtoMinor < 1:
		return http.StatusBadRequest, "bus: a WebSocket upgrade needs HTTP/1.1"
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		w.Header().Set("Sec-WebSocket-Version", "13")
		return http.StatusUpgradeRequired, "bus: only WebSocket version 13 is supported"
	}
	if key, err := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key")); err != nil || len(key) != 16 {
		return http.StatusBadRequest, "bus: Sec-WebSocket-Key is not 16 bytes in base64"
	}
	// A browser sends the page's origin: a page from elsewhere must not
	// open a connection with the credentials the browser holds for the bus
	// (cross-site WebSocket hijacking). Clients that are not browsers send
	// no Origin.
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" {
			return http.StatusForbidden, "bus: the Origin header is not a URL with a host"
		}
		if !strings.EqualFold(u.Host, r.Host) {
			return http.StatusForbidden, fmt.Sprintf("bus: a page from %q may not open a connection to %q", u.Host, r.Host)
		}
	}
	return 0, ""
}

// headerHasToken tells whether one of the comma-separated values of a
// header is token, in any case.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// upgrade checks the handshake, then takes the connection from net/http
// and completes it. It returns the connection with a reader of
// readBufferSize holding whatever the client sent after its request: the
// 4 KiB buffers net/http hands over with a hijacked connection would
// otherwise stay allocated for every idle connection.
func upgrade(w http.ResponseWriter, r *http.Request) (net.Conn, *bufio.Reader, error) {
	if status, message := checkUpgrade(w, r); status != 0 {
		server.WriteError(w, status, message)
		return nil, nil, fmt.Errorf("wsconn: handshake refused: %s", message)
	}
	// What checkUpgrade let through, the upgrader accepts: it only answers.
	conn, brw, _, err := ws.HTTPUpgrader{}.Upgrade(r, w)
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, nil, fmt.Errorf("wsconn: upgrade: %w", err)
	}
	var from io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the client sent right after its request (golang/go#32314).
		early, _ := brw.Reader.Peek(n)
		from = io.MultiReader(bytes.NewReader(bytes.Clone(early)), conn)
	}
	return conn, bufio.NewReaderSize(from, readBufferSize), nil
}
