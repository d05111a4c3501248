package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestNodeComponents starts dynalite and fauxqs and speaks to each with a raw
// AWS JSON request, so a broken install fails here with a clear message
// rather than deep inside a store or queue test.
func TestNodeComponents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dynalite and fauxqs")
	}
	t.Parallel()
	tests := []struct {
		name   string
		start  func(context.Context) (*testenv.Component, error)
		target string
		want   string
	}{
		{"dynalite", testenv.Dynalite, "DynamoDB_20120810.ListTables", "TableNames"},
		{"fauxqs", testenv.Fauxqs, "AmazonSQS.ListQueues", "{"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := tt.start(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Stop)
			resp, err := http.DefaultClient.Do(awsJSONRequest(c.Endpoint, tt.target))
			if err != nil {
				t.Fatalf("%s: %v\n%s", tt.name, err, c.Output())
			}
			defer resp.Body.Close()
			var body strings.Builder
			_, _ = io.Copy(&body, resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), tt.want) {
				t.Fatalf("%s answered %d: %s", tt.name, resp.StatusCode, body.String())
			}
		})
	}
}

// awsJSONRequest is a raw AWS JSON call of target with an empty body,
// signed with a dummy signature the emulators do not check.
func awsJSONRequest(endpoint, target string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, endpoint+"/", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", target)
	req.Header.Set("X-Amz-Date", "20260101T000000Z")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00")
	return req
}

// TestStartOnATakenPort: a component whose port another process took
// first exits at once (EADDRINUSE) while the other process answers on the
// port; Start must say it exited, not hand the tests the stranger.
func TestStartOnATakenPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dynalite")
	}
	t.Parallel()
	stranger, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	go func() {
		for {
			conn, err := stranger.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	port := testenv.As[*net.TCPAddr](t, stranger.Addr(), "the stranger's address").Port
	node, script, err := testenv.NodeScript("dynalite", "cli.js")
	if err != nil {
		t.Fatal(err)
	}
	c, err := testenv.Start(context.Background(), "dynalite", port, node, script, "--host", "127.0.0.1", "--port", strconv.Itoa(port))
	if err == nil {
		c.Stop()
		t.Fatal("Start returned a component whose port another process holds")
	}
	if !errors.Is(err, testenv.ErrExited) || !strings.Contains(err.Error(), "EADDRINUSE") {
		t.Fatalf("Start: %v; want ErrExited with dynalite's EADDRINUSE", err)
	}
}

// TestDynaliteServesOnAfterAnAbort: a client that drops a request half
// sent (a Go context cancelled mid-call) must not end dynalite, which
// throws from the request's 'error' listener unless guarded: every later
// test of the package would meet "connection refused".
func TestDynaliteServesOnAfterAnAbort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dynalite")
	}
	t.Parallel()
	c := testenv.DynaliteFor(t)
	conn, err := net.Dial("tcp", c.Addr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: "+c.Addr+"\r\nContent-Type: application/x-amz-json-1.0\r\n"+
		"X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{")
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Once dynalite has seen the abort (guarded or not, it says "aborted"),
	// it must still answer.
	testenv.EventuallyNoError(t, time.Minute, "dynalite to notice the aborted request", func() error {
		if out := c.Output(); !strings.Contains(out, "aborted") {
			return fmt.Errorf("its output:\n%s", out)
		}
		return nil
	})
	resp, err := http.DefaultClient.Do(awsJSONRequest(c.Endpoint, "DynamoDB_20120810.ListTables"))
	if err != nil {
		t.Fatalf("after the abort: %v\n%s", err, c.Output())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the abort: HTTP %d", resp.StatusCode)
	}
}
