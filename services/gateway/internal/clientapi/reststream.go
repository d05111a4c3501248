package clientapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/server"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// serveSend streams SendMessage. Its first response, which carries only
// the request_id (and the thread, and the message's entry), comes as soon
// as the gateway has queued the message, and goes out at once with the
// headers, so a caller of a silent agent can cancel. See streamForm for
// the two forms.
func (h *REST) serveSend(w http.ResponseWriter, r *http.Request) {
	if !checkPathIDs(w, r) {
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
	h.serveStream(w, r, gatewayv1.GatewayService_SendMessage_FullMethodName, func(ss grpc.ServerStream) error {
		return h.api.SendMessage(req, &grpc.GenericServerStream[gatewayv1.SendMessageRequest, gatewayv1.SendMessageResponse]{ServerStream: ss})
	})
}

// serveWatch streams WatchThread: ?after= (or, for an EventSource that
// reconnects, its Last-Event-ID header) and ?request_id=.
func (h *REST) serveWatch(w http.ResponseWriter, r *http.Request) {
	if !checkPathIDs(w, r) {
		return
	}
	q := r.URL.Query()
	req := &gatewayv1.WatchThreadRequest{ThreadId: r.PathValue("thread_id"), After: q.Get("after"), RequestId: q.Get("request_id")}
	if req.After == "" {
		req.After = r.Header.Get("Last-Event-ID")
	}
	h.serveStream(w, r, gatewayv1.GatewayService_WatchThread_FullMethodName, func(ss grpc.ServerStream) error {
		return h.api.WatchThread(req, &grpc.GenericServerStream[gatewayv1.WatchThreadRequest, gatewayv1.WatchThreadResponse]{ServerStream: ss})
	})
}

// serveStream runs a server-streaming call through the interceptors, its
// responses written in the form the request asks for. The first response
// or the error decides the HTTP status: an error before any response (an
// unknown agent: 404) is an HTTP error like any other.
func (h *REST) serveStream(w http.ResponseWriter, r *http.Request, method string, call func(grpc.ServerStream) error) {
	form := ndjson
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		form = sse
	}
	ss := &httpStream{ctx: Incoming(r), w: w, form: form}
	ss.flusher, _ = w.(http.Flusher)
	err := h.stream(h.api, ss, &grpc.StreamServerInfo{FullMethod: method, IsServerStream: true}, func(_ any, s grpc.ServerStream) error {
		return call(s)
	})
	if !ss.started {
		h.writeError(w, r, err)
		return
	}
	if ss.failed {
		return // the client is gone
	}
	if err == nil {
		form.end(w)
	} else {
		if cause, ok := server.HiddenCause(err); ok {
			h.log.ErrorContext(r.Context(), "REST stream failed", "method", r.Method, "path", r.URL.Path, "error", cause)
		}
		form.fail(w, status.Convert(err))
	}
	ss.flush()
}

// httpStream is a grpc.ServerStream whose messages are written to an HTTP
// response. It sends no gRPC metadata: headers and trailers set on it are
// dropped.
type httpStream struct {
	ctx     context.Context
	w       http.ResponseWriter
	flusher http.Flusher
	form    streamForm
	started bool
	failed  bool
}

var _ grpc.ServerStream = (*httpStream)(nil)

func (s *httpStream) SetHeader(metadata.MD) error  { return nil }
func (s *httpStream) SendHeader(metadata.MD) error { return nil }
func (s *httpStream) SetTrailer(metadata.MD)       {}
func (s *httpStream) Context() context.Context     { return s.ctx }

// RecvMsg is never called: the request was read from the HTTP body.
func (s *httpStream) RecvMsg(any) error { return io.EOF }

func (s *httpStream) SendMsg(m any) error {
	msg, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "cannot stream a %T", m)
	}
	if !s.started {
		s.started = true
		s.form.start(s.w)
	}
	if err := s.form.message(s.w, msg); err != nil {
		s.failed = true
		return err
	}
	s.flush()
	return nil
}

func (s *httpStream) flush() {
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

// streamForm writes one of the two stream forms:
//
//   - newline-delimited JSON: each response as one line of JSON, then, if
//     the call fails, {"error": google.rpc.Status} as the last line;
//   - Server-Sent Events: one "message" event per response, its data the
//     response as JSON and its id the response's entry_id when it has one;
//     then "end" (data {}), or "error" whose data is a google.rpc.Status.
type streamForm struct {
	contentType string
	message     func(w io.Writer, m proto.Message) error
	end         func(w io.Writer)
	fail        func(w io.Writer, st *status.Status)
}

func (f streamForm) start(w http.ResponseWriter) {
	w.Header().Set("Content-Type", f.contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
}

// entryID is the history entry a streamed response names, if any.
func entryID(m proto.Message) string {
	switch x := m.(type) {
	case *gatewayv1.SendMessageResponse:
		return x.GetEntryId()
	case *gatewayv1.WatchThreadResponse:
		return x.GetEntry().GetEntryId()
	}
	return ""
}

var (
	sse = streamForm{
		contentType: "text/event-stream",
		message: func(w io.Writer, m proto.Message) error {
			data, err := jsonOf(m)
			if err != nil {
				return err
			}
			id := ""
			if e := entryID(m); e != "" {
				id = "id: " + e + "\n"
			}
			_, err = fmt.Fprintf(w, "%sevent: message\ndata: %s\n\n", id, data)
			return err
		},
		end: func(w io.Writer) { _, _ = io.WriteString(w, "event: end\ndata: {}\n\n") },
		fail: func(w io.Writer, st *status.Status) {
			_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", statusJSON(st))
		},
	}
	ndjson = streamForm{
		contentType: "application/x-ndjson",
		message: func(w io.Writer, m proto.Message) error {
			data, err := jsonOf(m)
			if err != nil {
				return err
			}
			_, err = w.Write(append(data, '\n'))
			return err
		},
		end:  func(io.Writer) {},
		fail: func(w io.Writer, st *status.Status) { _, _ = fmt.Fprintf(w, "{\"error\":%s}\n", statusJSON(st)) },
	}
)
