package clientapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// RESTAuth is what REST checks itself before a request reaches the gRPC
// listener: the client tokens, and the throttle of wrong ones. It has to:
// REST reaches gRPC from this process's own address, so only here is the
// caller's address known.
type RESTAuth struct {
	Tokens   *auth.Tokens
	Throttle *auth.Throttle
}

// marshal is the REST JSON: the proto field names, snake_case as the seeds
// write them, and every field present (an empty list as [], false and 0
// as such, an absent object as null), so that a client reading a member
// the API documents finds it. Only the members of the oneof event that an
// agent did not send stay out. The API has no 64-bit integers, which
// protojson would write as strings.
var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// REST is the client API as REST, over a connection to this gateway's own
// gRPC listener, so that REST requests pass the same interceptors as gRPC
// ones.
type REST struct {
	mux    *runtime.ServeMux
	client gatewayv1.GatewayServiceClient
	auth   *RESTAuth
}

// pathIDs are the path parameters that carry ids, with their rule.
var pathIDs = map[string]ids.Kind{"agent_id": ids.AgentID, "request_id": ids.RequestID}

// NewREST serves the client API as REST through grpc-gateway over conn,
// and SendMessage as a stream of its own: newline-delimited JSON, or
// Server-Sent Events for clients that ask for text/event-stream. Every
// error is a google.rpc.Status, as grpc-gateway writes it.
//
// With check (a server with client tokens), a request that presents a
// bearer token is checked here first: a wrong one is answered 401 and
// counted against the caller's address, and an address that presented too
// many is answered 429 with Retry-After.
func NewREST(ctx context.Context, conn grpc.ClientConnInterface, check *RESTAuth) (*REST, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   marshal,
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		// A path parameter is one segment, unescaped whole: an agent_id
		// with '/' is reached as %2F, as coven-gateway routes it.
		runtime.WithUnescapingMode(runtime.UnescapingModeAllExceptReserved),
		runtime.WithErrorHandler(func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
			if e, ok := bodyTooLarge(r); ok {
				WriteHTTPError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", e.Limit))
				return
			}
			runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
		}),
		// Routes reach grpc-gateway only through the server's mux, which
		// answers unknown paths and methods itself; this is a backstop.
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, code int) {
			WriteHTTPError(w, code, strings.ToLower(http.StatusText(code)))
		}),
	)
	client := gatewayv1.NewGatewayServiceClient(conn)
	if err := gatewayv1.RegisterGatewayServiceHandlerClient(ctx, mux, client); err != nil {
		return nil, fmt.Errorf("registering REST routes: %w", err)
	}
	return &REST{mux: mux, client: client, auth: check}, nil
}

// Routes registers the REST routes: unary for the bounded calls, stream
// for SendMessage. The server's mux routes them, so an unknown path or a
// wrong method is answered (404, 405 with Allow) in the server's error
// shape, WriteHTTPError.
func (h *REST) Routes(unary, stream func(pattern string, h http.Handler)) {
	unary("GET /v1/agents", http.HandlerFunc(h.serveUnary))
	unary("GET /v1/agents/{agent_id}", http.HandlerFunc(h.serveUnary))
	unary("POST /v1/requests/{request_id}/cancel", http.HandlerFunc(h.serveUnary))
	stream("POST /v1/agents/{agent_id}/messages", http.HandlerFunc(h.serveSend))
}

func (h *REST) serveUnary(w http.ResponseWriter, r *http.Request) {
	if !h.authorize(w, r) || !checkPathIDs(w, r) {
		return
	}
	watchBody(r)
	h.mux.ServeHTTP(w, headAsGet(r))
}

// authorize answers a request whose bearer token is wrong or throttled,
// and reports whether the request may go on.
func (h *REST) authorize(w http.ResponseWriter, r *http.Request) bool {
	if h.auth == nil {
		return true
	}
	if err := h.auth.check(w, r); err != nil {
		st, _ := status.FromError(err)
		writeStatus(w, st)
		return false
	}
	return true
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
		return status.Error(codes.ResourceExhausted, auth.ThrottledMessage)
	}
	if !a.Tokens.Valid(token) {
		a.Throttle.FailHTTP(r)
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
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

// serveSend streams SendMessage. Its first response, which carries only
// the request_id, comes as soon as the gateway has queued the message,
// and goes out at once with the headers, so a caller of a silent agent can
// cancel. As Server-Sent Events: one "message" event per response, its
// data the SendMessageResponse as JSON, then "end", or "error" with a
// google.rpc.Status. As newline-delimited JSON, grpc-gateway's stream
// form: {"result": response} per line, or {"error": status} last.
func (h *REST) serveSend(w http.ResponseWriter, r *http.Request) {
	if !h.authorize(w, r) || !checkPathIDs(w, r) {
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if e, ok := errors.AsType[*http.MaxBytesError](err); ok {
			WriteHTTPError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", e.Limit))
			return
		}
		writeStatus(w, status.New(codes.InvalidArgument, "the request body could not be read"))
		return
	}
	req := &gatewayv1.SendMessageRequest{}
	if len(body) > 0 {
		if err := protojson.Unmarshal(body, req); err != nil {
			writeStatus(w, status.Newf(codes.InvalidArgument, "body is not a SendMessageRequest: %v", err))
			return
		}
	}
	req.AgentId = r.PathValue("agent_id")
	ctx := r.Context()
	if a := r.Header.Get("Authorization"); a != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
	}
	stream, err := h.client.SendMessage(ctx, req)
	if err != nil {
		writeStatus(w, status.Convert(err))
		return
	}
	// The first response or error decides the HTTP status, so an unknown
	// agent is a 404, not a 200 with an error in the stream.
	first, err := stream.Recv()
	if err != nil {
		writeStatus(w, status.Convert(err))
		return
	}
	out := ndjson
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		out = sse
	}
	out.start(w)
	flusher, _ := w.(http.Flusher)
	n := 0
	for msg := first; err == nil; msg, err = stream.Recv() {
		n++
		if werr := out.message(w, n, msg); werr != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	if errors.Is(err, io.EOF) {
		out.end(w)
	} else {
		out.fail(w, status.Convert(err))
	}
	if flusher != nil {
		flusher.Flush()
	}
}

// streamForm writes one of SendMessage's two stream forms.
type streamForm struct {
	contentType string
	message     func(w io.Writer, n int, m *gatewayv1.SendMessageResponse) error
	end         func(w io.Writer)
	fail        func(w io.Writer, st *status.Status)
}

func (f streamForm) start(w http.ResponseWriter) {
	w.Header().Set("Content-Type", f.contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
}

var (
	sse = streamForm{
		contentType: "text/event-stream",
		message: func(w io.Writer, n int, m *gatewayv1.SendMessageResponse) error {
			data, _ := marshal.Marshal(m)
			_, err := fmt.Fprintf(w, "id: %d\nevent: message\ndata: %s\n\n", n, data)
			return err
		},
		end: func(w io.Writer) { _, _ = fmt.Fprint(w, "event: end\ndata: {}\n\n") },
		fail: func(w io.Writer, st *status.Status) {
			_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", statusJSON(st))
		},
	}
	ndjson = streamForm{
		contentType: "application/json",
		message: func(w io.Writer, _ int, m *gatewayv1.SendMessageResponse) error {
			return writeLine(w, "result", m)
		},
		end:  func(io.Writer) {},
		fail: func(w io.Writer, st *status.Status) { _, _ = fmt.Fprintf(w, "{\"error\":%s}\n", statusJSON(st)) },
	}
)

// writeLine writes {"<key>": m} and a newline.
func writeLine(w io.Writer, key string, m proto.Message) error {
	data, err := marshal.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "{%q:%s}\n", key, data)
	return err
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
	data, err := marshal.Marshal(st.Proto())
	if err != nil {
		data, _ = marshal.Marshal(status.New(st.Code(), strings.ToValidUTF8(st.Message(), "\uFFFD")).Proto())
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
