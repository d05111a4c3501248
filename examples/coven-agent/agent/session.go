package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// stream is the part of an AgentStream a session uses.
type stream interface {
	Send(*covenpb.AgentMessage) error
	Recv() (*covenpb.ServerMessage, error)
	CloseSend() error
}

// closeGrace bounds how long a session winds down: for the in-flight reply
// to stop once the agent is stopping, and for the gateway to end the stream
// once the agent has closed its side.
const closeGrace = 5 * time.Second

var (
	errStopping  = errors.New("the agent is stopping")
	errAbandoned = errors.New("the stream ended")
)

// session serves one registered AgentStream.
type session struct {
	stream stream
	// abort ends the stream at once, unblocking its Send and Recv.
	abort     func()
	log       *slog.Logger
	replier   replier
	heartbeat time.Duration

	// gRPC allows one sender at a time; replies and heartbeats share it.
	sendMu sync.Mutex
}

func (s *session) send(m *covenpb.AgentMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

func (s *session) emit(r *covenpb.MessageResponse) error {
	return s.send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}})
}

// job is a request received and not yet answered. Its context exists from
// receipt on, so a request can be cancelled while it still waits its turn.
type job struct {
	msg    *covenpb.SendMessage
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// serve answers requests one at a time, in the order they arrive, until the
// stream ends. When the gateway sends Shutdown it finishes what it was given,
// closes its side and returns an error naming the reason, so the caller
// reconnects, through the load balancer, to another replica. When ctx ends it
// cancels its work, closes its side and returns nil.
func (s *session) serve(ctx context.Context) error {
	inbox := make(chan *covenpb.ServerMessage)
	recvErr := make(chan error, 1)
	quit := make(chan struct{})
	go func() {
		for {
			m, err := s.stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case inbox <- m:
			case <-quit:
				return
			}
		}
	}()

	// Requests are cancelled by CancelRequest one at a time, and all at once
	// when the agent stops; none outlives serve.
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	var (
		queue    []*job
		current  *job
		finished = make(chan error, 1)
	)
	defer func() {
		close(quit)
		s.abort()
		stopWork(errAbandoned)
		if current != nil {
			<-finished
		}
	}()
	start := func() {
		current, queue = queue[0], queue[1:]
		m := current.msg
		s.log.InfoContext(ctx, "answering", "request_id", m.GetRequestId(), "thread_id", m.GetThreadId(), "sender", m.GetSender())
		go func(j *job) {
			defer j.cancel(nil)
			finished <- s.replier.reply(j.ctx, j.msg, s.emit)
		}(current)
	}
	// find returns the unanswered request with this ID, if any.
	find := func(id string) *job {
		if current != nil && current.msg.GetRequestId() == id {
			return current
		}
		for _, j := range queue {
			if j.msg.GetRequestId() == id {
				return j
			}
		}
		return nil
	}

	var (
		stopping = ctx.Done()
		leaving  error // why the session is winding down, once it is
		closed   bool
		giveUp   <-chan time.Time
	)
	// closeWhenIdle closes the agent's side once the session is winding down
	// and every request it was given has been answered; the gateway then
	// deregisters the agent and ends the stream.
	closeWhenIdle := func() error {
		if leaving == nil || closed || current != nil || len(queue) > 0 {
			return nil
		}
		closed = true
		giveUp = time.After(closeGrace)
		if err := s.stream.CloseSend(); err != nil {
			return fmt.Errorf("close the stream: %w", err)
		}
		return nil
	}
	hb := time.NewTicker(s.heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-stopping:
			stopping = nil
			leaving = errStopping
			// Queued requests start already cancelled, so each still gets
			// its answer.
			stopWork(errStopping)
			giveUp = time.After(closeGrace)
			if err := closeWhenIdle(); err != nil {
				return err
			}

		case <-hb.C:
			if !closed {
				// A failed send shows up as the stream's end in Recv.
				_ = s.send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{
					Heartbeat: &covenpb.Heartbeat{TimestampMs: time.Now().UnixMilli()},
				}})
			}

		case m := <-inbox:
			switch p := m.GetPayload().(type) {
			case *covenpb.ServerMessage_SendMessage:
				if closed {
					s.log.WarnContext(ctx, "request arrived after the agent closed its side; the gateway will fail it",
						"request_id", p.SendMessage.GetRequestId())
					continue
				}
				jctx, cancel := context.WithCancelCause(work)
				queue = append(queue, &job{msg: p.SendMessage, ctx: jctx, cancel: cancel})
				if current == nil {
					start()
				}
			case *covenpb.ServerMessage_CancelRequest:
				id := p.CancelRequest.GetRequestId()
				j := find(id)
				if j == nil {
					s.log.DebugContext(ctx, "ignored cancel for a request already answered", "request_id", id)
					continue
				}
				reason := p.CancelRequest.GetReason()
				if reason == "" {
					reason = "cancelled by the gateway"
				}
				s.log.InfoContext(ctx, "cancelling", "request_id", id, "reason", reason)
				j.cancel(errors.New(reason))
			case *covenpb.ServerMessage_Shutdown:
				reason := p.Shutdown.GetReason()
				s.log.InfoContext(ctx, "gateway asked the agent to leave; finishing current work", "reason", reason)
				if leaving == nil {
					leaving = fmt.Errorf("gateway asked the agent to leave: %s", reason)
				}
				if err := closeWhenIdle(); err != nil {
					return err
				}
			default:
				s.log.WarnContext(ctx, "ignored unexpected message", "payload", fmt.Sprintf("%T", p))
			}

		case err := <-finished:
			id := current.msg.GetRequestId()
			current = nil
			if err != nil {
				// A failed send has aborted the stream: Recv reports how it
				// ended, and nothing more can be answered on it.
				s.log.WarnContext(ctx, "could not answer", "request_id", id, "error", err)
				queue = nil // their contexts end with work's
				continue
			}
			s.log.InfoContext(ctx, "answered", "request_id", id)
			if len(queue) > 0 {
				start()
			} else if err := closeWhenIdle(); err != nil {
				return err
			}

		case err := <-recvErr:
			if closed && errors.Is(err, io.EOF) {
				if errors.Is(leaving, errStopping) {
					return nil
				}
				return leaving
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the gateway ended the stream")
			}
			return fmt.Errorf("stream broken: %w", err)

		case <-giveUp:
			return fmt.Errorf("%w, but the stream did not end within %s", leaving, closeGrace)
		}
	}
}
