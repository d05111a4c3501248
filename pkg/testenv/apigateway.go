package testenv

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// APIGateway serves a function's HTTP API in front of its Runtime API, as an
// API Gateway HTTP API with a Lambda proxy integration does: each request
// becomes a payload format 2.0 event (its headers lower-cased, repeated ones
// joined by commas, its cookies in cookies, a body that is not UTF-8 in
// base64), invoked on rt one at a time, and the function's response
// (statusCode, headers, multiValueHeaders, cookies, body) becomes the HTTP
// answer. A function error is a 500 and a function that cannot be invoked
// a 502, with API Gateway's bodies. It is for tests: it speaks plain HTTP
// and is as permissive as a $default route.
func APIGateway(rt *LambdaRuntime) http.Handler {
	var seq atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, `{"message":"Bad Request"}`, http.StatusBadRequest)
			return
		}
		ev := apiGatewayV2Request{Version: "2.0", RouteKey: "$default", RawPath: r.URL.EscapedPath(), RawQueryString: r.URL.RawQuery,
			Headers: map[string]string{}}
		for k, vs := range r.Header {
			if strings.EqualFold(k, "Cookie") {
				for _, v := range vs {
					for c := range strings.SplitSeq(v, ";") {
						if c = strings.TrimSpace(c); c != "" {
							ev.Cookies = append(ev.Cookies, c)
						}
					}
				}
				continue
			}
			ev.Headers[strings.ToLower(k)] = strings.Join(vs, ",")
		}
		ev.Headers["host"] = r.Host
		now := time.Now()
		sourceIP, _, _ := net.SplitHostPort(r.RemoteAddr)
		c := &ev.RequestContext
		c.AccountID, c.APIID, c.DomainName, c.Stage, c.RouteKey = "000000000000", "testenv", r.Host, "$default", "$default"
		c.RequestID = "testenv-" + strconv.FormatInt(seq.Add(1), 10)
		c.Time, c.TimeEpoch = now.UTC().Format("02/Jan/2006:15:04:05 -0700"), now.UnixMilli()
		c.HTTP.Method, c.HTTP.Path, c.HTTP.Protocol, c.HTTP.SourceIP, c.HTTP.UserAgent = r.Method, r.URL.Path, r.Proto, sourceIP, r.UserAgent()
		if utf8.Valid(body) {
			ev.Body = string(body)
		} else {
			ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
		}
		event, err := json.Marshal(ev)
		if err != nil {
			http.Error(w, `{"message":"Internal Server Error"}`, http.StatusInternalServerError)
			return
		}
		res, err := rt.Invoke(r.Context(), event, nil)
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, `{"message":"Bad Gateway"}`)
			return
		}
		var out apiGatewayV2Response
		if len(res.Error) > 0 || json.Unmarshal(res.Payload, &out) != nil || out.StatusCode == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"message":"Internal Server Error"}`)
			return
		}
		for k, v := range out.Headers {
			w.Header().Set(k, v)
		}
		for k, vs := range out.MultiValueHeaders {
			w.Header()[http.CanonicalHeaderKey(k)] = vs
		}
		for _, c := range out.Cookies {
			w.Header().Add("Set-Cookie", c)
		}
		data := []byte(out.Body)
		if out.IsBase64Encoded {
			if data, err = base64.StdEncoding.DecodeString(out.Body); err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
		}
		w.WriteHeader(out.StatusCode)
		_, _ = w.Write(data)
	})
}

// apiGatewayV2Request is an HTTP API's payload format 2.0 event.
type apiGatewayV2Request struct {
	Version        string            `json:"version"`
	RouteKey       string            `json:"routeKey"`
	RawPath        string            `json:"rawPath"`
	RawQueryString string            `json:"rawQueryString"`
	Cookies        []string          `json:"cookies,omitempty"`
	Headers        map[string]string `json:"headers"`
	RequestContext struct {
		AccountID  string `json:"accountId"`
		APIID      string `json:"apiId"`
		DomainName string `json:"domainName"`
		RequestID  string `json:"requestId"`
		RouteKey   string `json:"routeKey"`
		Stage      string `json:"stage"`
		Time       string `json:"time"`
		TimeEpoch  int64  `json:"timeEpoch"`
		HTTP       struct {
			Method    string `json:"method"`
			Path      string `json:"path"`
			Protocol  string `json:"protocol"`
			SourceIP  string `json:"sourceIp"`
			UserAgent string `json:"userAgent"`
		} `json:"http"`
	} `json:"requestContext"`
	Body            string `json:"body,omitempty"`
	IsBase64Encoded bool   `json:"isBase64Encoded"`
}

// apiGatewayV2Response is a function's answer to one.
type apiGatewayV2Response struct {
	StatusCode        int                 `json:"statusCode"`
	Headers           map[string]string   `json:"headers"`
	MultiValueHeaders map[string][]string `json:"multiValueHeaders"`
	Cookies           []string            `json:"cookies"`
	Body              string              `json:"body"`
	IsBase64Encoded   bool                `json:"isBase64Encoded"`
}
