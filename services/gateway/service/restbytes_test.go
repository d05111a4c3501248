package service_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// docExamples are the blocks of docs/gateway-clients.md marked
// "<!-- exact: NAME -->", by name: the bytes the REST API writes.
func docExamples(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/gateway-clients.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(doc)))
	name, in := "", false
	var block []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.HasPrefix(line, "<!-- exact: "):
			name = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- exact: "), " -->")
		case name != "" && !in && line == "```":
			in, block = true, nil
		case in && line == "```":
			out[name] = strings.Join(block, "\n") + "\n"
			name, in = "", false
		case in:
			block = append(block, line)
		}
	}
	return out
}

var (
	requestIDPattern = regexp.MustCompile(`"request_id":"([^"]+)"`)
	entryMsPattern   = regexp.MustCompile(`"entry_id":"([0-9]{13})\.`)
)

// normalized replaces what differs from run to run (the request id, the
// request's start in ms) with the values docs/gateway-clients.md's examples use.
func normalized(body string) string {
	if m := requestIDPattern.FindStringSubmatch(body); m != nil {
		body = strings.ReplaceAll(body, m[1], "gw-1.00112233445566778899aabb")
	}
	if m := entryMsPattern.FindStringSubmatch(body); m != nil {
		body = strings.ReplaceAll(body, m[1]+".gw-1.", "1767225600000.gw-1.")
	}
	return body
}

// TestRESTStreamBytes checks the REST streams' bytes against the examples
// in docs/gateway-clients.md, and that no response carries gRPC metadata headers.
func TestRESTStreamBytes(t *testing.T) {
	t.Parallel()
	examples := docExamples(t)
	conn, base := startTuned(t, "gw-bytes", openStore(t), withHistory(nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoAgent(t, ctx, conn, "echo")
	for _, tt := range []struct {
		name, method, path, body, accept string
		status                           int
		contentType                      string
	}{
		{"send-ndjson", "POST", "/v1/agents/echo/messages", `{"content":"hello","thread_id":"th-doc"}`, "", 200, "application/x-ndjson"},
		{"send-sse", "POST", "/v1/agents/echo/messages", `{"content":"hello","thread_id":"th-doc"}`, "text/event-stream", 200, "text/event-stream"},
		{"send-404", "POST", "/v1/agents/ghost/messages", `{"content":"hello"}`, "", 404, "application/json"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, ok := examples[tt.name]
			if !ok {
				t.Fatalf("docs/gateway-clients.md has no example %q", tt.name)
			}
			resp, body := restCall(t, tt.method, base+tt.path, tt.body, "Accept", tt.accept)
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != tt.contentType {
				t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if got := normalized(string(body)); got != want {
				t.Errorf("bytes differ from docs/gateway-clients.md:\n got %q\nwant %q", got, want)
			}
			noGRPCHeaders(t, resp.Header)
		})
	}
	for _, path := range []string{"/v1/agents", "/v1/agents/echo", "/v1/agents/ghost", "/v1/threads/th-doc/messages", "/v1/agents/echo/threads", "/v1/threads/th-doc/watch"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		noGRPCHeaders(t, resp.Header)
	}
}

func noGRPCHeaders(t *testing.T, h http.Header) {
	t.Helper()
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "grpc-") {
			t.Errorf("gRPC metadata in an HTTP header: %s: %s", k, h.Get(k))
		}
	}
}
