package clientapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/server"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// marshal is the REST JSON: the proto field names, snake_case as Kandev's and
// the Librarian's APIs write them, and every field present (an empty list as
// [], false and 0 as such, an absent object as null), so that a client
// reading a member the API documents finds it. Only the members of a oneof
// that are not set stay out. The API has no 64-bit integers, which protojson
// would write as strings.
var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// jsonOf is m as the REST JSON, compact: protojson varies its spacing from
// build to build on purpose, and the API's bytes are documented.
func jsonOf(m proto.Message) ([]byte, error) {
	data, err := marshal.Marshal(m)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// compactJSON is grpc-gateway's marshaler writing jsonOf's bytes.
type compactJSON struct{ runtime.JSONPb }

func (c *compactJSON) Marshal(v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		return jsonOf(m)
	}
	return c.JSONPb.Marshal(v)
}

// Interceptors are what every client API call passes, over gRPC and over
// REST alike: authentication, then the per-client limits.
type Interceptors struct {
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// Chain is the interceptors as one of each kind, run in order, for calls
// made in process.
func (ic Interceptors) Chain() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return chainUnary(append([]grpc.UnaryServerInterceptor{traceUnary}, ic.Unary...)),
		chainStream(append([]grpc.StreamServerInterceptor{traceStream}, ic.Stream...))
}

// REST is the client API as REST, calling the service in this process:
// grpc-gateway's routing and JSON mapping for the unary calls, handlers of
// its own for the streams, each through the same interceptors as gRPC.
type REST struct {
	mux    *runtime.ServeMux
	api    gatewayv1.GatewayServiceServer
	stream grpc.StreamServerInterceptor
	log    *slog.Logger
}

// pathIDs are the path parameters that carry ids, with their rule.
var pathIDs = map[string]ids.Kind{"agent_id": ids.AgentID, "request_id": ids.RequestID, "thread_id": ids.ThreadID}

// NewREST serves api as REST, each call through ic as on gRPC. Every error
// is a google.rpc.Status as JSON; the responses carry no gRPC metadata.
func NewREST(api gatewayv1.GatewayServiceServer, ic Interceptors, logger *slog.Logger) (*REST, error) {
	none := func(string) (string, bool) { return "", false }
	unary, stream := ic.Chain()
	h := &REST{api: api, stream: stream, log: logger}
	h.mux = runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &compactJSON{runtime.JSONPb{
			MarshalOptions:   marshal,
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		// A path parameter is one segment, unescaped whole: an agent_id
		// with '/' is reached as %2F, as coven-gateway routes it.
		runtime.WithUnescapingMode(runtime.UnescapingModeAllExceptReserved),
		// No header becomes metadata but authorization (which
		// grpc-gateway always passes), and no metadata becomes a header.
		runtime.WithIncomingHeaderMatcher(none),
		runtime.WithOutgoingHeaderMatcher(none),
		runtime.WithOutgoingTrailerMatcher(none),
		runtime.WithErrorHandler(func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
			if e, ok := bodyTooLarge(r); ok {
				WriteHTTPError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", e.Limit))
				return
			}
			h.writeError(w, r, err)
		}),
		// Routes reach grpc-gateway only through the server's mux, which
		// answers unknown paths and methods itself; this is a backstop.
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, code int) {
			WriteHTTPError(w, code, strings.ToLower(http.StatusText(code)))
		}),
	)
	if err := gatewayv1.RegisterGatewayServiceHandlerServer(context.Background(), h.mux, intercepted{api: api, unary: unary}); err != nil {
		return nil, fmt.Errorf("registering REST routes: %w", err)
	}
	return h, nil
}

// Routes registers the REST routes: unary for the bounded calls, stream
// for SendMessage and WatchThread. The server's mux routes them, so an
// unknown path or a wrong method is answered (404, 405 with Allow) in the
// server's error shape, WriteHTTPError.
func (h *REST) Routes(unary, stream func(pattern string, h http.Handler)) {
	for _, p := range []string{
		"GET /v1/agents", "GET /v1/agents/{agent_id}", "POST /v1/requests/{request_id}/cancel",
		"GET /v1/agents/{agent_id}/threads", "GET /v1/threads/{thread_id}/messages",
	} {
		unary(p, http.HandlerFunc(h.serveUnary))
	}
	stream("POST /v1/agents/{agent_id}/messages", http.HandlerFunc(h.serveSend))
	stream("GET /v1/threads/{thread_id}/watch", http.HandlerFunc(h.serveWatch))
}

func (h *REST) serveUnary(w http.ResponseWriter, r *http.Request) {
	if !checkPathIDs(w, r) {
		return
	}
	watchBody(r)
	h.mux.ServeHTTP(w, withPeer(headAsGet(r)))
}

// remoteAddr is an HTTP request's remote address as a net.Addr.
type remoteAddr string

func (a remoteAddr) Network() string { return "tcp" }
func (a remoteAddr) String() string  { return string(a) }

// withPeer gives the call the caller's address, as gRPC gives it a
// connection's: the throttle of wrong tokens counts by it.
func withPeer(r *http.Request) *http.Request {
	return r.WithContext(peer.NewContext(r.Context(), &peer.Peer{Addr: remoteAddr(r.RemoteAddr)}))
}

// Incoming is the context of a call made in process for an HTTP request
// (a REST stream, an A2A call): the caller's address and its
// authorization header as gRPC metadata, nothing else, as the
// interceptors and forwarding to another replica read them.
func Incoming(r *http.Request) context.Context {
	md := metadata.MD{}
	for _, v := range r.Header.Values("Authorization") {
		md.Append("authorization", v)
	}
	return metadata.NewIncomingContext(withPeer(r).Context(), md)
}

// headAsGet lets a HEAD reach the GET route the server's mux matched it
// to (grpc-gateway has no HEAD routes); net/http sends no body for it.
func headAsGet(r *http.Request) *http.Request {
	if r.Method != http.MethodHead {
		return r
	}
	r = r.Clone(r.Context())
	r.Method = http.MethodGet
	return r
}

// checkPathIDs answers 400 naming the field for an id in the path that
// its rule refuses, before it reaches marshalling (which fails on invalid
// UTF-8) or a store. It reports whether the request may go on.
func checkPathIDs(w http.ResponseWriter, r *http.Request) bool {
	for name, kind := range pathIDs {
		if v := r.PathValue(name); v != "" {
			if err := kind.Check(v); err != nil {
				writeStatus(w, status.New(codes.InvalidArgument, err.Error()))
				return false
			}
		}
	}
	return true
}

// writeError answers err as grpc-gateway does, with Retry-After when the
// status says when to retry; a cause the status hides is logged, as the
// gRPC server's logging does for gRPC calls.
func (h *REST) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if cause, ok := server.HiddenCause(err); ok {
		h.log.ErrorContext(r.Context(), "REST call failed", "method", r.Method, "path", r.URL.Path, "error", cause)
	}
	st := status.Convert(err)
	if wait := retryDelay(st); wait > 0 {
		w.Header().Set("Retry-After", auth.RetryAfter(wait))
	}
	writeStatus(w, st)
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// intercepted is the service as grpc-gateway calls it in process: each
// unary call through the interceptors, as the gRPC server runs them.
type intercepted struct {
	gatewayv1.UnimplementedGatewayServiceServer
	api   gatewayv1.GatewayServiceServer
	unary grpc.UnaryServerInterceptor
}

func invoke[Req, Resp any](ctx context.Context, i intercepted, method string, req Req, call func(context.Context, Req) (Resp, error)) (Resp, error) {
	out, err := i.unary(ctx, req, &grpc.UnaryServerInfo{Server: i.api, FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		return call(ctx, req.(Req))
	})
	if err != nil {
		var zero Resp
		return zero, err
	}
	return out.(Resp), nil
}

func (i intercepted) ListAgents(ctx context.Context, req *gatewayv1.ListAgentsRequest) (*gatewayv1.ListAgentsResponse, error) {
	return invoke(ctx, i, gatewayv1.GatewayService_ListAgents_FullMethodName, req, i.api.ListAgents)
}

func (i intercepted) GetAgent(ctx context.Context, req *gatewayv1.GetAgentRequest) (*gatewayv1.GetAgentResponse, error) {
	return invoke(ctx, i, gatewayv1.GatewayService_GetAgent_FullMethodName, req, i.api.GetAgent)
}

func (i intercepted) CancelMessage(ctx context.Context, req *gatewayv1.CancelMessageRequest) (*gatewayv1.CancelMessageResponse, error) {
	return invoke(ctx, i, gatewayv1.GatewayService_CancelMessage_FullMethodName, req, i.api.CancelMessage)
}

func (i intercepted) History(ctx context.Context, req *gatewayv1.HistoryRequest) (*gatewayv1.HistoryResponse, error) {
	return invoke(ctx, i, gatewayv1.GatewayService_History_FullMethodName, req, i.api.History)
}

func (i intercepted) ListThreads(ctx context.Context, req *gatewayv1.ListThreadsRequest) (*gatewayv1.ListThreadsResponse, error) {
	return invoke(ctx, i, gatewayv1.GatewayService_ListThreads_FullMethodName, req, i.api.ListThreads)
}

// chainUnary runs ics in order around a handler, as grpc.ChainUnaryInterceptor does.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		for i := len(ics) - 1; i >= 0; i-- {
			ic, next := ics[i], h
			h = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, next) }
		}
		return h(ctx, req)
	}
}

// chainStream runs ics in order around a handler, as grpc.ChainStreamInterceptor does.
func chainStream(ics []grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		for i := len(ics) - 1; i >= 0; i-- {
			ic, next := ics[i], h
			h = func(srv any, ss grpc.ServerStream) error { return ic(srv, ss, info, next) }
		}
		return h(srv, ss)
	}
}

// writeStatus answers st as grpc-gateway does: the HTTP status of its
// code, the google.rpc.Status as JSON.
func writeStatus(w http.ResponseWriter, st *status.Status) {
	writeStatusAs(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

// statusJSON is st as JSON. A message quoting invalid UTF-8 from the
// request, or a detail that cannot be encoded, would make protojson fail:
// the code and a valid message still can be.
func statusJSON(st *status.Status) []byte {
	data, err := jsonOf(st.Proto())
	if err != nil {
		data, _ = jsonOf(status.New(st.Code(), strings.ToValidUTF8(st.Message(), "\uFFFD")).Proto())
	}
	return data
}

func writeStatusAs(w http.ResponseWriter, httpStatus int, st *status.Status) {
	data := statusJSON(st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(data, '\n'))
}

// WriteHTTPError answers, as a google.rpc.Status, the errors the server
// writes itself (server.WithHTTPErrorWriter): 404 and 405 for what no
// route takes, 413, 415, 500, 503. The HTTP status stays; the body's code
// is the gRPC code nearest to it.
func WriteHTTPError(w http.ResponseWriter, httpStatus int, message string) {
	writeStatusAs(w, httpStatus, status.New(codeOf(httpStatus), message))
}

// codeOf is the gRPC code for an HTTP status, the inverse of
// runtime.HTTPStatusFromCode where it has one.
func codeOf(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		// As grpc-gateway's own routing errors say it.
		return codes.Unimplemented
	case http.StatusConflict:
		return codes.Aborted
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		// As gRPC says a message over its size limit.
		return codes.ResourceExhausted
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	if httpStatus >= 500 {
		return codes.Internal
	}
	return codes.InvalidArgument
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

func watchBody(r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &watchedBody{ReadCloser: r.Body}
	}
}

func bodyTooLarge(r *http.Request) (*http.MaxBytesError, bool) {
	if b, ok := r.Body.(*watchedBody); ok && b.tooLarge != nil {
		return b.tooLarge, true
	}
	return nil, false
}
