package apigw_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/conclave-ai/conclave/functions/librarian/internal/apigw"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// echo answers with what it saw of the request.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/png" {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write([]byte{0x89, 'P', 'N', 'G', 0})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
	http.SetCookie(w, &http.Cookie{Name: "b", Value: "2"})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"method": r.Method, "path": r.URL.Path, "query": r.URL.RawQuery, "body": string(body), "host": r.Host,
		"cookie": r.Header.Get("Cookie"), "auth": r.Header.Get("Authorization"), "remote": r.RemoteAddr, "len": r.ContentLength,
	})
})

func invoke[T any](t *testing.T, event any) T {
	t.Helper()
	raw, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	out, err := apigw.Handler(echo)(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.As[T](t, out, "the handler's answer")
}

func TestPayloadV2(t *testing.T) {
	t.Parallel()
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/agent/request", RawQueryString: "a=1&b=2",
		Cookies: []string{"x=1", "y=2"}, Headers: map[string]string{"authorization": "Bearer t", "host": "api.example.com"},
		Body: base64.StdEncoding.EncodeToString([]byte(`{"k":"v"}`)), IsBase64Encoded: true}
	ev.RequestContext.HTTP.Method = "POST"
	ev.RequestContext.HTTP.SourceIP = "203.0.113.7"
	res := invoke[events.APIGatewayV2HTTPResponse](t, ev)
	var seen map[string]any
	if err := json.Unmarshal([]byte(res.Body), &seen); err != nil || res.StatusCode != 201 || res.IsBase64Encoded {
		t.Fatalf("%+v %v", res, err)
	}
	want := map[string]any{"method": "POST", "path": "/agent/request", "query": "a=1&b=2", "body": `{"k":"v"}`, "host": "api.example.com",
		"cookie": "x=1; y=2", "auth": "Bearer t", "remote": "203.0.113.7", "len": 9.0}
	for k, v := range want {
		if seen[k] != v {
			t.Errorf("%s = %v, want %v", k, seen[k], v)
		}
	}
	if len(res.Cookies) != 2 || res.Headers["Set-Cookie"] != "" || res.Headers["Content-Type"] != "application/json" {
		t.Fatalf("cookies %v headers %v", res.Cookies, res.Headers)
	}
}

func TestPayloadV1(t *testing.T) {
	t.Parallel()
	ev := events.APIGatewayProxyRequest{HTTPMethod: "GET", Path: "/agent/status/x",
		MultiValueQueryStringParameters: map[string][]string{"s": {"1", "2"}},
		MultiValueHeaders:               map[string][]string{"Authorization": {"Bearer t"}}, Body: ""}
	ev.RequestContext.DomainName = "api.example.com"
	res := invoke[events.APIGatewayProxyResponse](t, ev)
	var seen map[string]any
	if err := json.Unmarshal([]byte(res.Body), &seen); err != nil || res.StatusCode != 201 {
		t.Fatalf("%+v %v", res, err)
	}
	if seen["query"] != "s=1&s=2" || seen["auth"] != "Bearer t" || seen["host"] != "api.example.com" || len(res.MultiValueHeaders["Set-Cookie"]) != 2 {
		t.Fatalf("seen %v, headers %v", seen, res.MultiValueHeaders)
	}
}

func TestBinaryBodiesAndBadEvents(t *testing.T) {
	t.Parallel()
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/png"}
	ev.RequestContext.HTTP.Method = "GET"
	res := invoke[events.APIGatewayV2HTTPResponse](t, ev)
	if b, err := base64.StdEncoding.DecodeString(res.Body); !res.IsBase64Encoded || err != nil || string(b) != "\x89PNG\x00" {
		t.Fatalf("binary body %+v", res)
	}
	bad := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/", Body: "%%%", IsBase64Encoded: true}
	bad.RequestContext.HTTP.Method = "POST"
	if res := invoke[events.APIGatewayV2HTTPResponse](t, bad); res.StatusCode != 400 || !strings.Contains(res.Body, "malformed_event") {
		t.Fatalf("bad base64: %+v", res)
	}
	if _, err := apigw.Handler(echo)(context.Background(), []byte(`{"source":"aws.events"}`)); !errors.Is(err, apigw.ErrUnsupportedEvent) {
		t.Fatalf("a scheduled event: %v", err)
	}
	if _, err := apigw.Handler(echo)(context.Background(), []byte(`not json`)); err == nil {
		t.Fatal("not JSON accepted")
	}
	if c := apigw.EventCarrier([]byte(`{"headers":{"TraceParent":"00-abc"}}`)); c.Get("traceparent") != "00-abc" {
		t.Fatalf("carrier %v", c.Keys())
	}
}

// FuzzHandler: any event bytes give a response or an error, never a panic.
func FuzzHandler(f *testing.F) {
	f.Add([]byte(`{"version":"2.0","rawPath":"/agent/request","requestContext":{"http":{"method":"POST"}},"body":"{}"}`))
	f.Add([]byte(`{"httpMethod":"GET","path":"/x","multiValueQueryStringParameters":{"a":["1"]}}`))
	f.Add([]byte(`{"version":"2.0","rawPath":"//../x","requestContext":{"http":{"method":"GET"}},"isBase64Encoded":true,"body":"@@"}`))
	f.Add([]byte(`{"version":"2.0","requestContext":{"http":{"method":"bad method"}}}`))
	f.Fuzz(func(t *testing.T, event []byte) {
		out, err := apigw.Handler(echo)(context.Background(), event)
		if err == nil && out == nil {
			t.Fatal("no response and no error")
		}
	})
}
