package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// fakeStream is the gateway's end of an AgentStream, driven by the test, for
// unit tests of the session's own logic. Sends block until the test reads
// them, as a stream under flow control would.
type fakeStream struct {
	toAgent   chan *covenpb.ServerMessage
	fromAgent chan *covenpb.AgentMessage
	end       chan error // what Recv returns once the gateway ends the stream

	closeOnce, abortOnce sync.Once
	closed               chan struct{} // the agent closed its side
	aborted              chan struct{}
}

func newFakeStream() *fakeStream {
	return &fakeStream{
		toAgent:   make(chan *covenpb.ServerMessage),
		fromAgent: make(chan *covenpb.AgentMessage),
		end:       make(chan error, 1),
		closed:    make(chan struct{}),
		aborted:   make(chan struct{}),
	}
}

func (f *fakeStream) Send(m *covenpb.AgentMessage) error {
	select {
	case <-f.closed:
		return errors.New("Send after CloseSend")
	default:
	}
	select {
	case f.fromAgent <- m:
		return nil
	case <-f.aborted:
		return io.EOF
	}
}

func (f *fakeStream) Recv() (*covenpb.ServerMessage, error) {
	select {
	case m := <-f.toAgent:
		return m, nil
	case err := <-f.end:
		return nil, err
	case <-f.aborted:
		return nil, status.Error(codes.Canceled, "aborted")
	}
}

func (f *fakeStream) CloseSend() error {
	f.closeOnce.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeStream) abort() { f.abortOnce.Do(func() { close(f.aborted) }) }

// serve runs a session on a fake stream and returns the stream and serve's
// result.
func serve(t *testing.T, ctx context.Context, r replier, heartbeat time.Duration) (*fakeStream, <-chan error) {
	t.Helper()
	f := newFakeStream()
	s := &session{stream: f, abort: f.abort, log: slog.New(slog.DiscardHandler), replier: r, heartbeat: heartbeat}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(exited)
		done <- s.serve(ctx)
	}()
	t.Cleanup(func() {
		f.abort()
		<-exited
	})
	return f, done
}

func (f *fakeStream) deliver(t *testing.T, m *covenpb.ServerMessage) {
	t.Helper()
	select {
	case f.toAgent <- m:
	case <-time.After(10 * time.Second):
		t.Fatal("the session stopped reading")
	}
}

// next returns the agent's next response, skipping heartbeats.
func (f *fakeStream) next(t *testing.T) *covenpb.MessageResponse {
	t.Helper()
	for {
		select {
		case m := <-f.fromAgent:
			if r := m.GetResponse(); r != nil {
				return r
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no response from the agent")
		}
	}
}

// reply collects one request's events, up to the one that ends it.
func (f *fakeStream) reply(t *testing.T) []*covenpb.MessageResponse {
	t.Helper()
	var rs []*covenpb.MessageResponse
	for {
		r := f.next(t)
		rs = append(rs, r)
		if r.GetDone() != nil || r.GetCancelled() != nil || r.GetError() != "" {
			return rs
		}
	}
}

// awaitClosed waits for the agent to close its side, answering heartbeats
// meanwhile, and then ends the stream as the gateway does.
func (f *fakeStream) awaitClosed(t *testing.T) {
	t.Helper()
	for {
		select {
		case <-f.closed:
			f.end <- io.EOF
			return
		case m := <-f.fromAgent:
			if m.GetHeartbeat() == nil {
				t.Fatalf("unexpected %v while waiting for the agent to close its side", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the agent never closed its side")
		}
	}
}

// barrier returns once the session has handled every message delivered
// before it: it takes the next message only after handling the previous one.
func (f *fakeStream) barrier(t *testing.T) {
	t.Helper()
	f.deliver(t, &covenpb.ServerMessage{})
	f.deliver(t, &covenpb.ServerMessage{})
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
		return nil
	}
}

func sendMessage(id, content string) *covenpb.ServerMessage {
	return &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: &covenpb.SendMessage{RequestId: id, Content: content}}}
}

func cancelRequest(id, reason string) *covenpb.ServerMessage {
	cr := &covenpb.CancelRequest{RequestId: id}
	if reason != "" {
		cr.Reason = &reason
	}
	return &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_CancelRequest{CancelRequest: cr}}
}

// forever is a step delay no test waits out: a reply paced by it is in
// flight until something cancels it.
const forever = time.Hour

func TestSessionAnswersOneRequestAtATimeInOrder(t *testing.T) {
	t.Parallel()
	f, _ := serve(t, context.Background(), replier{now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "first"))
	f.deliver(t, sendMessage("b", "second"))
	for _, id := range []string{"a", "b"} {
		rs := f.reply(t)
		for _, r := range rs {
			if r.GetRequestId() != id {
				t.Fatalf("got an event of %s while answering %s: replies interleaved", r.GetRequestId(), id)
			}
		}
		if k := kinds(rs); !strings.HasPrefix(k, "Thinking") || !strings.HasSuffix(k, "Done") {
			t.Errorf("reply to %s = %s", id, k)
		}
	}
}

func TestSessionCancelsTheRequestInFlight(t *testing.T) {
	t.Parallel()
	f, _ := serve(t, context.Background(), replier{delay: forever, now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "slow"))
	f.deliver(t, cancelRequest("someone-else", "not this one"))
	f.deliver(t, cancelRequest("a", "user pressed stop"))
	if rs := f.reply(t); kinds(rs) != "Cancelled" || rs[0].GetCancelled().GetReason() != "user pressed stop" || rs[0].GetRequestId() != "a" {
		t.Fatalf("reply = %v, want cancelled with the reason", rs)
	}

	// The session goes on to the next request; a cancel without a reason
	// still says why.
	f.deliver(t, sendMessage("b", "slow too"))
	f.deliver(t, cancelRequest("b", ""))
	if rs := f.reply(t); rs[0].GetCancelled().GetReason() != "cancelled by the gateway" {
		t.Fatalf("reply = %v, want a default reason", rs)
	}
}

func TestSessionCancelsAQueuedRequestWhenItsTurnComes(t *testing.T) {
	t.Parallel()
	f, _ := serve(t, context.Background(), replier{delay: forever, now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "slow"))
	f.deliver(t, sendMessage("b", "queued"))
	f.deliver(t, cancelRequest("b", "changed my mind"))
	f.deliver(t, cancelRequest("a", "stop a"))
	for _, want := range []struct{ id, reason string }{{"a", "stop a"}, {"b", "changed my mind"}} {
		rs := f.reply(t)
		if kinds(rs) != "Cancelled" || rs[0].GetRequestId() != want.id || rs[0].GetCancelled().GetReason() != want.reason {
			t.Fatalf("reply = %v, want %s cancelled: %s", rs, want.id, want.reason)
		}
	}
}

func TestSessionFinishesItsWorkOnShutdownThenLeaves(t *testing.T) {
	t.Parallel()
	f, done := serve(t, context.Background(), replier{now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "finish me"))
	f.deliver(t, &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Shutdown{Shutdown: &covenpb.Shutdown{Reason: "replica draining"}}})
	// Each event but the last is read while the agent waits to send the
	// next, so its side must still be open.
	for r := f.next(t); r.GetDone() == nil; r = f.next(t) {
		select {
		case <-f.closed:
			t.Fatalf("the agent closed its side before finishing (at %s)", kind(r))
		default:
		}
	}
	f.awaitClosed(t)
	if err := result(t, done); err == nil || !strings.Contains(err.Error(), "replica draining") {
		t.Fatalf("serve = %v, want an error naming the Shutdown reason so the agent reconnects", err)
	}
}

func TestSessionStopsCleanlyWhenTheAgentStops(t *testing.T) {
	t.Parallel()
	ctx, stop := context.WithCancel(context.Background())
	f, done := serve(t, ctx, replier{delay: forever, now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "in flight"))
	f.barrier(t)
	stop()
	if rs := f.reply(t); rs[0].GetCancelled().GetReason() != errStopping.Error() {
		t.Fatalf("reply = %v, want the request in flight cancelled", rs)
	}
	f.awaitClosed(t)
	if err := result(t, done); err != nil {
		t.Fatalf("serve = %v, want nil after a clean stop", err)
	}
}

func TestSessionSendsHeartbeats(t *testing.T) {
	t.Parallel()
	f, _ := serve(t, context.Background(), replier{now: fixedNow}, time.Millisecond)
	for range 3 {
		select {
		case m := <-f.fromAgent:
			if hb := m.GetHeartbeat(); hb == nil || hb.GetTimestampMs() == 0 {
				t.Fatalf("got %v, want a timestamped heartbeat", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat")
		}
	}
}

func TestSessionReportsABrokenStream(t *testing.T) {
	t.Parallel()
	f, done := serve(t, context.Background(), replier{delay: forever, now: fixedNow}, time.Hour)
	f.deliver(t, sendMessage("a", "in flight"))
	f.end <- status.Error(codes.DeadlineExceeded, "agent sent nothing")
	if err := result(t, done); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("serve = %v, want the stream's status", err)
	}
}

func TestRegisterReportsTheRefusalStatus(t *testing.T) {
	t.Parallel()
	f := newFakeStream()
	defer f.abort()
	errc := make(chan error, 1)
	go func() {
		_, err := register(f, &covenpb.RegisterAgent{AgentId: "x"})
		errc <- err
	}()
	if m := <-f.fromAgent; m.GetRegister().GetAgentId() != "x" {
		t.Fatalf("first message = %v, want RegisterAgent", m)
	}
	f.deliver(t, &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_RegistrationError{
		RegistrationError: &covenpb.RegistrationError{Reason: `agent "x" is already connected`},
	}})
	f.end <- status.Error(codes.AlreadyExists, `agent "x" is already connected`)
	if err := result(t, errc); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("register = %v, want ALREADY_EXISTS", err)
	}
}
