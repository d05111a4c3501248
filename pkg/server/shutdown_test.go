package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// stopAsync starts the drain and returns Run's eventual result.
func stopAsync(ts *testServer) <-chan error {
	stopped := make(chan error, 1)
	go func() { stopped <- ts.stop() }()
	return stopped
}

func TestGracefulShutdownDrainsInFlightUnaryHTTP(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("POST /slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			// Draining must not cancel unary work that is already running.
			if err := r.Context().Err(); err != nil {
				WriteError(w, http.StatusInternalServerError, err.Error())
				return
			}
			_, _ = io.WriteString(w, "done")
		}))
	})
	result := make(chan httpResult, 1)
	go func() {
		resp, err := http.Post(ts.url("/slow"), "application/json", strings.NewReader("work"))
		if err != nil {
			result <- httpResult{err: err}
			return
		}
		result <- readResponse(resp)
	}()

	<-started
	stopped := stopAsync(ts)
	testenv.AwaitRefused(t, ts.HTTPAddr()) // the drain is under way and takes no new connections
	close(release)

	if res := <-result; res.err != nil || res.status != http.StatusOK || res.body != "done" {
		t.Errorf("in-flight request = %d %q, %v; want 200 done", res.status, res.body, res.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil after a clean drain", err)
	}
}

func TestGracefulShutdownDrainsInFlightGRPCStream(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, func(s *Server) {
		registerTestService(s, &testService{stream: func(ss grpc.ServerStream) error {
			var in wrapperspb.StringValue
			if err := ss.RecvMsg(&in); err != nil {
				return err
			}
			close(started)
			<-release
			return ss.SendMsg(&in)
		}})
	})
	cs, err := openStream(t.Context(), ts.dial(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.String("hello")); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}

	<-started
	stopped := stopAsync(ts)
	testenv.AwaitRefused(t, ts.GRPCAddr()) // GracefulStop has begun
	close(release)

	var out wrapperspb.StringValue
	if err := cs.RecvMsg(&out); err != nil || out.GetValue() != "hello" {
		t.Errorf("in-flight stream Recv = %q, %v; want hello", out.GetValue(), err)
	}
	if err := cs.RecvMsg(&out); err != io.EOF {
		t.Errorf("stream end = %v, want io.EOF (status OK)", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil after a clean drain", err)
	}
}

func TestShutdownDeadlineForcesStop(t *testing.T) {
	t.Parallel()
	// A short deadline is configuration here, not an assertion: nothing
	// below measures how long the drain took.
	cfg := bothListeners()
	cfg.ShutdownTimeout = 100 * time.Millisecond

	tests := []struct {
		name  string
		setup func(s *Server, started chan<- struct{}, release <-chan struct{})
		call  func(t *testing.T, ts *testServer) error // blocks until the server cuts the call
	}{
		{
			name: "grpc stream that never ends",
			setup: func(s *Server, started chan<- struct{}, _ <-chan struct{}) {
				registerTestService(s, &testService{stream: func(ss grpc.ServerStream) error {
					close(started)
					<-ss.Context().Done()
					return ss.Context().Err()
				}})
			},
			call: func(t *testing.T, ts *testServer) error {
				cs, err := openStream(t.Context(), ts.dial(t))
				if err != nil {
					return err
				}
				if err := cs.SendMsg(wrapperspb.String("hi")); err != nil {
					return err
				}
				err = cs.RecvMsg(new(wrapperspb.StringValue))
				if err == nil {
					return errors.New("stream produced a message")
				}
				return err
			},
		},
		{
			name: "http handler that ignores its context",
			setup: func(s *Server, started chan<- struct{}, release <-chan struct{}) {
				s.Handle("GET /stuck", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
					close(started)
					<-release
				}))
			},
			call: func(t *testing.T, ts *testServer) error {
				res := get(t, ts.url("/stuck"))
				if res.err == nil {
					return errors.New("request completed")
				}
				return res.err
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			started, release := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(release) })
			ts := startServer(t, cfg, func(s *Server) { tt.setup(s, started, release) })
			callErr := make(chan error, 1)
			go func() { callErr <- tt.call(t, ts) }()

			<-started
			err := ts.stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Run = %v, want an error wrapping context.DeadlineExceeded", err)
			}
			if err := <-callErr; err == nil {
				t.Error("in-flight call succeeded, want it cut by the forced stop")
			}
			// Reported above; keep the cleanup from reporting it again.
			ts.runErr = nil
		})
	}
}

func TestShutdownEndsHTTPStreams(t *testing.T) {
	t.Parallel()
	causes := make(chan error, 1)
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.HandleStream("GET /events", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "data: hello\n\n")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
			<-r.Context().Done()
			causes <- context.Cause(r.Context())
			_, _ = io.WriteString(w, "event: bye\n\n")
		}))
	})
	resp, err := http.Get(ts.url("/events"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); err != nil || line != "data: hello\n" {
		t.Fatalf("first event = %q, %v", line, err)
	}

	stopped := stopAsync(ts)
	if cause := <-causes; !errors.Is(cause, ErrDraining) {
		t.Errorf("stream context cause = %v, want ErrDraining", cause)
	}
	// The handler's farewell still reaches the client, and the response
	// ends cleanly rather than being cut.
	if rest, err := io.ReadAll(body); err != nil || !strings.Contains(string(rest), "event: bye") {
		t.Errorf("rest of stream = %q, %v; want the farewell and a clean end", rest, err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil: streams must not hold the drain until its deadline", err)
	}
}

func TestShutdownEndsHealthWatch(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, nil)
	watch, err := healthpb.NewHealthClient(ts.dial(t)).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first Watch update = %v, %v; want SERVING", resp, err)
	}

	stopped := stopAsync(ts)
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch update on drain = %v, %v; want NOT_SERVING", resp, err)
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Watch end = %v, want Canceled", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil: a Watch must not hold the drain until its deadline", err)
	}
}

func TestShutdownHooks(t *testing.T) {
	t.Parallel()
	var ran []string
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.OnShutdown(func(context.Context) { ran = append(ran, "first") })
		s.OnShutdown(func(context.Context) { panic("hook boom") })
		s.OnShutdown(func(ctx context.Context) {
			if _, ok := ctx.Deadline(); ok {
				ran = append(ran, "last, with deadline")
			}
		})
	})
	if err := ts.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if want := []string{"first", "last, with deadline"}; !slices.Equal(ran, want) {
		t.Errorf("hooks ran %v, want %v", ran, want)
	}
	if !strings.Contains(ts.logs.String(), "hook boom") {
		t.Errorf("hook panic not logged; logs:\n%s", ts.logs)
	}
}

// A drained route's requests run to completion through the drain, while
// new ones are refused; streams stay open until the drained requests are
// done, since their clients may be waiting for results there.
func TestShutdownDrainsDrainedRoutes(t *testing.T) {
	t.Parallel()
	var (
		started, release  = make(chan struct{}), make(chan struct{})
		hookRan, hookDone = make(chan struct{}), make(chan struct{})
		streamOpen        = make(chan context.Context, 1)
		streamCause       = make(chan error, 1)
	)
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.HandleDrained("POST /call", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("late") != "" {
				WriteError(w, http.StatusInternalServerError, "a request arriving during the drain was let in")
				return
			}
			close(started)
			<-release
			if err := context.Cause(r.Context()); err != nil {
				WriteError(w, http.StatusInternalServerError, "drained request cancelled: "+err.Error())
				return
			}
			select {
			case ctx := <-streamOpen:
				if ctx.Err() != nil {
					WriteError(w, http.StatusInternalServerError, "stream ended before the drained request")
					return
				}
			default:
				WriteError(w, http.StatusInternalServerError, "no stream open")
				return
			}
			_, _ = io.WriteString(w, "result")
		}))
		s.HandleStream("GET /events", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			streamOpen <- r.Context()
			_, _ = io.WriteString(w, "data: hello\n\n")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
			<-r.Context().Done()
			streamCause <- context.Cause(r.Context())
		}))
		// The hook holds the listeners open, so that the test can send a
		// request to a server that is draining but still accepting.
		s.OnShutdown(func(context.Context) {
			close(hookRan)
			<-hookDone
		})
	})

	stream, err := http.Get(ts.url("/events"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Body.Close() }()
	if line, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil || line != "data: hello\n" {
		t.Fatalf("first event = %q, %v", line, err)
	}
	result := make(chan httpResult, 1)
	go func() {
		resp, err := http.Post(ts.url("/call"), "application/json", strings.NewReader("work"))
		if err != nil {
			result <- httpResult{err: err}
			return
		}
		result <- readResponse(resp)
	}()
	<-started

	stopped := stopAsync(ts)
	<-hookRan
	late, err := http.Post(ts.url("/call?late=1"), "application/json", strings.NewReader("late"))
	if err != nil {
		t.Fatal(err)
	}
	if res := readResponse(late); res.status != http.StatusServiceUnavailable || late.Header.Get("Retry-After") == "" ||
		!strings.Contains(res.body, `"code":503`) {
		t.Errorf("request during the drain = %d %q (Retry-After %q); want 503 with a JSON error and Retry-After",
			res.status, res.body, late.Header.Get("Retry-After"))
	}
	close(hookDone)
	testenv.AwaitRefused(t, ts.HTTPAddr()) // the listeners are closed; the drained request still runs
	close(release)

	if res := <-result; res.err != nil || res.status != http.StatusOK || res.body != "result" {
		t.Errorf("drained request = %d %q, %v; want 200 result", res.status, res.body, res.err)
	}
	if cause := <-streamCause; !errors.Is(cause, ErrDraining) {
		t.Errorf("stream context cause = %v, want ErrDraining", cause)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil after a clean drain", err)
	}
}

// A drained request still running at the drain deadline is cancelled with
// ErrDrainDeadline, so that its handler stops its work.
func TestShutdownDeadlineCancelsDrainedRequests(t *testing.T) {
	t.Parallel()
	started, causes := make(chan struct{}), make(chan error, 1)
	// A short deadline is configuration, not an assertion.
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 100 * time.Millisecond}, func(s *Server) {
		s.HandleDrained("POST /call", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-r.Context().Done()
			causes <- context.Cause(r.Context())
		}))
	})
	go func() {
		if resp, err := http.Post(ts.url("/call"), "application/json", strings.NewReader("work")); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-started
	err := ts.stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	ts.runErr = nil // reported above
	if cause := <-causes; !errors.Is(cause, ErrDrainDeadline) {
		t.Errorf("drained request's context cause = %v, want ErrDrainDeadline", cause)
	}
}
