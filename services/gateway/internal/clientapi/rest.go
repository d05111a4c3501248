package clientapi

import (
	"context"
	"encoding/json"
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

	"github.com/conclave-ai/conclave/pkg/auth"
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
// write them.
var marshal = protojson.MarshalOptions{UseProtoNames: true}

// NewREST serves the client API as REST through grpc-gateway over conn (a
// connection to this gateway's own gRPC listener, so REST requests pass the
// same interceptors as gRPC ones), and SendMessage also as Server-Sent Events
// for clients that ask for text/event-stream.
//
// With check (a server with client tokens), a request that presents a
// bearer token is checked here first: a wrong one is answered 401 and
// counted against the caller's address, and an address that presented too
// many is answered 429 with Retry-After.
func NewREST(ctx context.Context, conn grpc.ClientConnInterface, check *RESTAuth) (http.Handler, error) {
	mux := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
		MarshalOptions:   marshal,
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}))
	client := gatewayv1.NewGatewayServiceClient(conn)
	if err := gatewayv1.RegisterGatewayServiceHandlerClient(ctx, mux, client); err != nil {
		return nil, fmt.Errorf("registering REST routes: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if check != nil {
			if err := check.check(w, r); err != nil {
				_, out := runtime.MarshalerForRequest(mux, r)
				runtime.HTTPError(r.Context(), mux, out, w, r, err)
				return
			}
		}
		if r.Method == http.MethodPost && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			serveSSE(w, r, client)
			return
		}
		mux.ServeHTTP(w, r)
	}), nil
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

// serveSSE streams SendMessage as Server-Sent Events: one "message" event
// per agent event, its data the SendMessageResponse as JSON, then "end", or
// "error" with {"code", "message"} when the request fails.
func serveSSE(w http.ResponseWriter, r *http.Request, client gatewayv1.GatewayServiceClient) {
	agentID := r.PathValue("agent_id")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("reading body: %v", err))
		return
	}
	req := &gatewayv1.SendMessageRequest{}
	if len(body) > 0 {
		if err := protojson.Unmarshal(body, req); err != nil {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("body is not a SendMessageRequest: %v", err))
			return
		}
	}
	if agentID != "" {
		req.AgentId = agentID
	}
	ctx := r.Context()
	if h := r.Header.Get("Authorization"); h != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", h)
	}
	stream, err := client.SendMessage(ctx, req)
	if err != nil {
		writeStatus(w, err)
		return
	}
	// The first event or error decides the HTTP status, so an unknown agent
	// is a 404, not a 200 with an error event.
	first, err := stream.Recv()
	if err != nil {
		writeStatus(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	for n := 1; ; n++ {
		data, _ := marshal.Marshal(first)
		fmt.Fprintf(w, "id: %d\nevent: message\ndata: %s\n\n", n, data)
		if flusher != nil {
			flusher.Flush()
		}
		if first, err = stream.Recv(); err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		fmt.Fprint(w, "event: end\ndata: {}\n\n")
	} else {
		st := status.Convert(err)
		data, _ := json.Marshal(map[string]any{"code": st.Code().String(), "message": st.Message()})
		fmt.Fprintf(w, "event: error\ndata: %s\n\n", data)
	}
	if flusher != nil {
		flusher.Flush()
	}
}

func writeStatus(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	writeJSONError(w, runtime.HTTPStatusFromCode(st.Code()), st.Message())
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg}})
}
