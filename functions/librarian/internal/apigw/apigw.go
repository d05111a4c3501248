// Package apigw adapts an http.Handler to Lambda invocations from API
// Gateway: HTTP API (payload format 2.0) events, and REST API (1.0) proxy
// events too, each answered in its own response format. It also reports
// init failures to the Lambda Runtime API, which aws-lambda-go does not.
package apigw

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"go.opentelemetry.io/otel/propagation"
)

// probe tells the payload formats apart.
type probe struct {
	Version    string `json:"version"`
	HTTPMethod string `json:"httpMethod"`
}

// ErrUnsupportedEvent is returned for an event that is not from API Gateway.
var ErrUnsupportedEvent = errors.New("apigw: not an API Gateway proxy event (payload format 1.0 or 2.0)")

// Handler returns the Lambda handler serving h.
func Handler(h http.Handler) func(ctx context.Context, event json.RawMessage) (any, error) {
	return func(ctx context.Context, event json.RawMessage) (any, error) {
		var p probe
		if err := json.Unmarshal(event, &p); err != nil {
			return nil, fmt.Errorf("apigw: event is not JSON: %w", err)
		}
		switch {
		case p.Version == "2.0":
			var ev events.APIGatewayV2HTTPRequest
			if err := json.Unmarshal(event, &ev); err != nil {
				return nil, fmt.Errorf("apigw: payload 2.0: %w", err)
			}
			req, err := fromV2(ctx, ev)
			if err != nil {
				return badRequestV2(err), nil
			}
			return toV2(serve(h, req)), nil
		case p.HTTPMethod != "":
			var ev events.APIGatewayProxyRequest
			if err := json.Unmarshal(event, &ev); err != nil {
				return nil, fmt.Errorf("apigw: payload 1.0: %w", err)
			}
			req, err := fromV1(ctx, ev)
			if err != nil {
				v2 := badRequestV2(err)
				return events.APIGatewayProxyResponse{StatusCode: v2.StatusCode, Headers: v2.Headers, Body: v2.Body}, nil
			}
			return toV1(serve(h, req)), nil
		}
		return nil, ErrUnsupportedEvent
	}
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func body(s string, b64 bool) ([]byte, error) {
	if !b64 {
		return []byte(s), nil
	}
	return base64.StdEncoding.DecodeString(s)
}

func fromV2(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	b, err := body(ev.Body, ev.IsBase64Encoded)
	if err != nil {
		return nil, fmt.Errorf("the body is not base64: %w", err)
	}
	u := &url.URL{Path: ev.RawPath, RawQuery: ev.RawQueryString}
	if ev.RawPath == "" {
		u.Path = ev.RequestContext.HTTP.Path
	}
	r, err := http.NewRequestWithContext(ctx, ev.RequestContext.HTTP.Method, u.String(), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	for k, v := range ev.Headers {
		// Payload 2.0 joins repeated headers with commas, as HTTP allows.
		r.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		r.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	finish(r, ev.RequestContext.DomainName, ev.RequestContext.HTTP.SourceIP, len(b))
	return r, nil
}

func fromV1(ctx context.Context, ev events.APIGatewayProxyRequest) (*http.Request, error) {
	b, err := body(ev.Body, ev.IsBase64Encoded)
	if err != nil {
		return nil, fmt.Errorf("the body is not base64: %w", err)
	}
	q := url.Values{}
	for k, vs := range ev.MultiValueQueryStringParameters {
		q[k] = vs
	}
	if len(q) == 0 {
		for k, v := range ev.QueryStringParameters {
			q.Set(k, v)
		}
	}
	u := &url.URL{Path: ev.Path, RawQuery: q.Encode()}
	r, err := http.NewRequestWithContext(ctx, ev.HTTPMethod, u.String(), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	for k, v := range ev.Headers {
		r.Header.Set(k, v)
	}
	for k, vs := range ev.MultiValueHeaders {
		r.Header[http.CanonicalHeaderKey(k)] = vs
	}
	finish(r, ev.RequestContext.DomainName, ev.RequestContext.Identity.SourceIP, len(b))
	return r, nil
}

func finish(r *http.Request, domain, sourceIP string, n int) {
	r.ContentLength = int64(n)
	r.Host = r.Header.Get("Host")
	if r.Host == "" {
		r.Host = domain
	}
	r.RemoteAddr = sourceIP
	// API Gateway only serves https; the request arrives decrypted.
	r.Header.Set("X-Forwarded-Proto", "https")
}

// textual content is returned as it is; anything else base64-encoded.
func textual(contentType string) bool {
	return contentType == "" || strings.HasPrefix(contentType, "text/") || strings.Contains(contentType, "json") ||
		strings.Contains(contentType, "xml") || strings.Contains(contentType, "javascript")
}

func toV2(rec *httptest.ResponseRecorder) events.APIGatewayV2HTTPResponse {
	res := rec.Result()
	out := events.APIGatewayV2HTTPResponse{StatusCode: res.StatusCode, Headers: map[string]string{}}
	for k, vs := range res.Header {
		if k == "Set-Cookie" {
			out.Cookies = vs
			continue
		}
		out.Headers[k] = strings.Join(vs, ", ")
	}
	out.Body, out.IsBase64Encoded = encodeBody(rec.Body.Bytes(), res.Header.Get("Content-Type"))
	return out
}

func toV1(rec *httptest.ResponseRecorder) events.APIGatewayProxyResponse {
	res := rec.Result()
	out := events.APIGatewayProxyResponse{StatusCode: res.StatusCode, MultiValueHeaders: map[string][]string{}}
	for k, vs := range res.Header {
		out.MultiValueHeaders[k] = vs
	}
	out.Body, out.IsBase64Encoded = encodeBody(rec.Body.Bytes(), res.Header.Get("Content-Type"))
	return out
}

func encodeBody(b []byte, contentType string) (string, bool) {
	if textual(contentType) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

func badRequestV2(err error) events.APIGatewayV2HTTPResponse {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": 400, "status": "malformed_event", "message": err.Error()}})
	return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusBadRequest, Headers: map[string]string{"Content-Type": "application/json"}, Body: string(b)}
}

// EventCarrier finds the trace context API Gateway forwards in an event's
// headers (traceparent, tracestate), for otellambda.
func EventCarrier(event []byte) propagation.TextMapCarrier {
	var ev struct {
		Headers map[string]string `json:"headers"`
	}
	_ = json.Unmarshal(event, &ev)
	carrier := propagation.MapCarrier{}
	for k, v := range ev.Headers {
		carrier[strings.ToLower(k)] = v
	}
	return carrier
}

// ReportInitError tells the Lambda Runtime API (AWS_LAMBDA_RUNTIME_API)
// that initialization failed, so that the failure and its message show in
// the function's invocation result and logs instead of a bare exit.
func ReportInitError(err error) error {
	api := os.Getenv("AWS_LAMBDA_RUNTIME_API")
	if api == "" {
		return errors.New("apigw: AWS_LAMBDA_RUNTIME_API is not set")
	}
	b, _ := json.Marshal(map[string]any{"errorMessage": err.Error(), "errorType": "Runtime.InitError"})
	req, rerr := http.NewRequest(http.MethodPost, "http://"+api+"/2018-06-01/runtime/init/error", bytes.NewReader(b))
	if rerr != nil {
		return rerr
	}
	req.Header.Set("Lambda-Runtime-Function-Error-Type", "Runtime.InitError")
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, rerr := client.Do(req)
	if rerr != nil {
		return rerr
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("apigw: the Runtime API answered init/error with %s", resp.Status)
	}
	return nil
}
