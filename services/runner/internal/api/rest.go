package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// marshal writes Kandev's JSON: snake_case names, and every field, so a
// starting instance has "progress": 0, "container_id": "" and
// "finished_at": null, as Kandev's examples show them.
var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// ErrorBody is Kandev's HTTP error body; details is always there ("" when
// there are none), as Kandev's examples show it.
type ErrorBody struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Details    string `json:"details"`
	HTTPStatus int    `json:"http_status"`
}

// launchKeys are the members of Kandev's launch response: the instance
// as launched, without the progress and finished_at its status has.
var launchKeys = []string{"id", "task_id", "agent_type", "container_id", "status", "started_at"}

// kandevLaunchBody cuts a launch's 200 response down to launchKeys.
type kandevLaunchBody struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (w *kandevLaunchBody) WriteHeader(code int) { w.status = code }

func (w *kandevLaunchBody) Write(p []byte) (int, error) {
	w.body = append(w.body, p...)
	return len(p), nil
}

// finish writes the response, cut when it is a launched instance.
func (w *kandevLaunchBody) finish() {
	status, body := cmp.Or(w.status, http.StatusOK), w.body
	var all map[string]json.RawMessage
	if status == http.StatusOK && json.Unmarshal(body, &all) == nil {
		cut := make(map[string]json.RawMessage, len(launchKeys))
		for _, k := range launchKeys {
			if v, ok := all[k]; ok {
				cut[k] = v
			}
		}
		if data, err := json.Marshal(cut); err == nil {
			body = data
		}
	}
	w.ResponseWriter.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.ResponseWriter.WriteHeader(status)
	_, _ = w.ResponseWriter.Write(body)
}

// errorBody turns a gRPC error into Kandev's error body.
func errorBody(err error) ErrorBody {
	st := status.Convert(err)
	httpStatus := runtime.HTTPStatusFromCode(st.Code())
	body := ErrorBody{Message: st.Message(), HTTPStatus: httpStatus}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			body.Error, body.Details = info.GetReason(), info.GetMetadata()["details"]
		}
	}
	if body.Error == "" {
		switch st.Code() {
		case codes.NotFound:
			body.Error = CodeNotFound
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
			body.Error = CodeBadRequest
		case codes.Unauthenticated:
			body.Error = "unauthorized"
		case codes.PermissionDenied:
			body.Error = "forbidden"
		case codes.ResourceExhausted:
			body.Error = "rate_limited"
		default:
			body.Error = CodeInternal
		}
	}
	return body
}

func writeError(w http.ResponseWriter, err error) {
	writeBody(w, errorBody(err))
}

func writeBody(w http.ResponseWriter, body ErrorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(body.HTTPStatus)
	_ = json.NewEncoder(w).Encode(body)
}

// WriteHTTPError answers, in Kandev's error body, the errors pkg/server writes
// itself (server.WithHTTPErrorWriter) and the REST mux's own: 404 for a
// path no route has, 405 (with Allow) for a wrong method, 413 for a body
// over the limit, 415 for a body that is not JSON, 500 for a recovered
// panic, 503 while draining. Each status has its own code; Kandev's API lists
// its common ones and leaves room for more.
func WriteHTTPError(w http.ResponseWriter, status int, message string) {
	body := ErrorBody{Error: CodeBadRequest, Message: message, HTTPStatus: status}
	switch {
	case status == http.StatusForbidden:
		body.Error = "forbidden"
	case status == http.StatusNotFound:
		body.Error = CodeNotFound
	case status == http.StatusMethodNotAllowed:
		body.Error = CodeMethodNotAllowed
	case status == http.StatusRequestEntityTooLarge:
		body.Error, body.Details = CodePayloadTooLarge, "send a smaller request body"
	case status == http.StatusUnsupportedMediaType:
		body.Error, body.Details = CodeUnsupportedMediaType, "send application/json"
	case status == http.StatusTooManyRequests:
		body.Error = CodeRateLimited
	case status == http.StatusServiceUnavailable:
		body.Error = CodeUnavailable
	case status >= 500:
		body.Error = CodeInternal
	}
	writeBody(w, body)
}

// watchedBody notes that reading the request body hit the server's size
// limit, which grpc-gateway reports only as a 400 carrying the error's text.
type watchedBody struct {
	io.ReadCloser
	tooLarge *http.MaxBytesError
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if e, ok := errors.AsType[*http.MaxBytesError](err); ok {
		b.tooLarge = e
	}
	return n, err
}

func bodyTooLarge(r *http.Request) (*http.MaxBytesError, bool) {
	if b, ok := r.Body.(*watchedBody); ok && b.tooLarge != nil {
		return b.tooLarge, true
	}
	return nil, false
}

// RESTAuth is what REST checks itself before a request reaches the gRPC
// listener: the client tokens, and the throttle of wrong ones. It has to:
// REST reaches gRPC from this process's own address, so only here is the
// caller's address known.
type RESTAuth struct {
	Tokens   *auth.Tokens
	Throttle *auth.Throttle
}

// check returns the status a request with a wrong or throttled bearer
// token gets, or nil. A request without one goes on, for the gRPC
// listener to refuse as it refuses any call without a token.
func (a *RESTAuth) check(w http.ResponseWriter, r *http.Request) error {
	token, ok := auth.Bearer(r.Header.Get("Authorization"))
	if !ok {
		return nil
	}
	if !a.Throttle.HTTP(w, r) {
		return apiError(codes.ResourceExhausted, "rate_limited", auth.ThrottledMessage, "wait for Retry-After, then send a right token")
	}
	if !a.Tokens.Valid(token) {
		a.Throttle.FailHTTP(r)
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

// REST is the API as REST, through grpc-gateway over a connection to the
// runner's own gRPC listener, so that REST passes the same authentication
// and tracing, with Kandev's error bodies for every error (a body over
// the server's limit, malformed JSON, a bad id in the path, an unknown
// path, a wrong method; a Content-Type other than JSON is refused before,
// by pkg/server's content-type rule, in WriteHTTPError's body), and
// logs?follow=true as newline-delimited JSON LogLines.
type REST struct {
	mux    *runtime.ServeMux
	client runnerv1.RunnerServiceClient
	auth   *RESTAuth
}

// NewREST builds the REST API over conn. With check (a runner with client
// tokens), a request that presents a wrong bearer token is refused here,
// 401, and counted against its address, which gets 429 once it presented
// too many.
func NewREST(ctx context.Context, conn grpc.ClientConnInterface, check *RESTAuth) (*REST, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{MarshalOptions: marshal}),
		runtime.WithErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
			if e, ok := bodyTooLarge(r); ok {
				WriteHTTPError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", e.Limit))
				return
			}
			writeError(w, err)
		}),
		// Routes reach grpc-gateway only through the server's mux, which
		// answers unknown paths and methods itself; this is a backstop.
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, code int) {
			if code == http.StatusBadRequest {
				WriteHTTPError(w, code, "malformed request")
				return
			}
			WriteHTTPError(w, code, strings.ToLower(http.StatusText(code)))
		}),
	)
	client := runnerv1.NewRunnerServiceClient(conn)
	if err := runnerv1.RegisterRunnerServiceHandlerClient(ctx, mux, client); err != nil {
		return nil, fmt.Errorf("registering REST routes: %w", err)
	}
	return &REST{mux: mux, client: client, auth: check}, nil
}

// Routes registers Kandev's paths on the server's mux: unary for the
// bounded calls, stream for the logs (which may follow). The server's mux
// routes them, so an unknown path or a wrong method is answered (404, 405
// with Allow) through WriteHTTPError.
func (h *REST) Routes(unary, stream func(pattern string, h http.Handler)) {
	for _, p := range []string{
		"POST /api/v1/agents/launch",
		"GET /api/v1/agents",
		"POST /api/v1/agents/{instance_id}/prompt",
		"POST /api/v1/agents/{instance_id}/cancel",
		"GET /api/v1/agents/{instance_id}/status",
		"GET /api/v1/agents/{instance_id}/session",
		"DELETE /api/v1/agents/{instance_id}",
		"GET /api/v1/tasks/{task_id}",
		"GET /api/v1/agent-types",
	} {
		unary(p, h)
	}
	stream(FollowPattern, h)
}

// pathIDs are the path parameters that carry ids, with their rule.
var pathIDs = map[string]ids.Kind{"instance_id": ids.InstanceID, "task_id": ids.TaskID}

func (h *REST) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.auth != nil {
		if err := h.auth.check(w, r); err != nil {
			writeError(w, err)
			return
		}
	}
	// Ids in the path are checked before they reach marshalling, which
	// fails on invalid UTF-8, or the store.
	for name, kind := range pathIDs {
		if v := r.PathValue(name); v != "" {
			if err := checkID(kind, v); err != nil {
				writeError(w, err)
				return
			}
		}
	}
	if r.Method == http.MethodGet && r.URL.Query().Get("follow") == "true" && r.PathValue("instance_id") != "" {
		serveFollow(w, r, h.client)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &watchedBody{ReadCloser: r.Body}
	}
	if r.Method == http.MethodPost && r.URL.Path == "/api/v1/agents/launch" {
		cut := &kandevLaunchBody{ResponseWriter: w}
		h.mux.ServeHTTP(cut, r)
		cut.finish()
		return
	}
	if r.Method == http.MethodHead {
		// The server's mux matched a GET route; grpc-gateway has no HEAD
		// routes, and net/http sends no body for it.
		r = r.Clone(r.Context())
		r.Method = http.MethodGet
	}
	h.mux.ServeHTTP(w, r)
}

// FollowPattern is the route serveFollow needs, for the HTTP mux.
const FollowPattern = "GET /api/v1/agents/{instance_id}/logs"

func serveFollow(w http.ResponseWriter, r *http.Request, client runnerv1.RunnerServiceClient) {
	req := &runnerv1.FollowAgentLogsRequest{InstanceId: r.PathValue("instance_id")}
	if t := r.URL.Query().Get("tail"); t != "" {
		n, err := strconv.ParseInt(t, 10, 32)
		if err != nil {
			writeError(w, validation("tail must be an integer", err.Error()))
			return
		}
		req.Tail = int32(n)
	}
	ctx := r.Context()
	if h := r.Header.Get("Authorization"); h != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", h)
	}
	stream, err := client.FollowAgentLogs(ctx, req)
	if err != nil {
		writeError(w, err)
		return
	}
	// The first line or error decides the status, so an unknown instance
	// is a 404.
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	for msg := first; err == nil; msg, err = stream.Recv() {
		data, _ := marshal.Marshal(msg.GetLine())
		if _, werr := w.Write(append(data, '\n')); werr != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	if !errors.Is(err, io.EOF) {
		body, _ := json.Marshal(map[string]any{"error": errorBody(err)})
		_, _ = w.Write(append(body, '\n'))
	}
}
