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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// marshal is the REST JSON: the proto field names, snake_case as the seeds
// write them, and every field present (an empty list as [], false and 0
// as such, an absent object as null), so that a client reading a member
// the API documents finds it. Only the members of the oneof event that an
// agent did not send stay out. The API has no 64-bit integers, which
// protojson would write as strings.
var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// NewREST serves the client API as REST through grpc-gateway over conn (a
// connection to this gateway's own gRPC listener, so REST requests pass the
// same interceptors as gRPC ones), and SendMessage also as Server-Sent Events
// for clients that ask for text/event-stream.
func NewREST(ctx context.Context, conn grpc.ClientConnInterface) (http.Handler, error) {
	mux := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
		MarshalOptions:   marshal,
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}))
	client := gatewayv1.NewGatewayServiceClient(conn)
	if err := gatewayv1.RegisterGatewayServiceHandlerClient(ctx, mux, client); err != nil {
		return nil, fmt.Errorf("registering REST routes: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			serveSSE(w, r, client)
			return
		}
		mux.ServeHTTP(w, r)
	}), nil
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
