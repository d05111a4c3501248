package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/supervisor"
)

// ForwardedKey marks a call one replica passed to the replica running the
// instance's agent (its owner). A replica handles a call so marked itself,
// whatever the store says, so that a call is forwarded at most once.
const ForwardedKey = "x-conclave-forwarded"

func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(ForwardedKey)) > 0
}

// Forwarded methods and outcomes, the label values of the forwarded calls'
// metric.
const (
	ForwardPrompt = "prompt"
	ForwardCancel = "cancel"
	ForwardDelete = "delete"

	// ForwardOK: the owner did what was asked.
	ForwardOK = "ok"
	// ForwardError: the owner answered with an error, passed to the caller.
	ForwardError = "error"
	// ForwardUnreachable: no answer from the owner (it is down or
	// partitioned); the call falls back to what this replica can do.
	ForwardUnreachable = "unreachable"
)

// ForwardMetrics is told of each forwarded call.
type ForwardMetrics interface {
	Forwarded(method, outcome string)
}

// Owners reaches the replicas that run instances' agents, keeping one
// connection per address for as long as the runner runs.
type Owners struct {
	opts    []grpc.DialOption
	timeout time.Duration
	metrics ForwardMetrics
	log     *slog.Logger

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// NewOwners returns Owners whose calls each get timeout; opts are the
// connections' dial options (transport credentials, tracing).
func NewOwners(timeout time.Duration, metrics ForwardMetrics, logger *slog.Logger, opts ...grpc.DialOption) *Owners {
	return &Owners{opts: opts, timeout: timeout, metrics: metrics, log: logger, conns: map[string]*grpc.ClientConn{}}
}

var errOwnersClosed = errors.New("the runner is shutting down")

func (o *Owners) client(addr string) (runnerv1.RunnerServiceClient, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errOwnersClosed
	}
	conn, ok := o.conns[addr]
	if !ok {
		var err error
		if conn, err = grpc.NewClient(addr, o.opts...); err != nil {
			return nil, fmt.Errorf("dialing runner replica %s: %w", addr, err)
		}
		o.conns[addr] = conn
	}
	return runnerv1.NewRunnerServiceClient(conn), nil
}

// forget closes the connection to addr unless it is connected: after a
// call that got no answer, one that is not is failing to connect (its
// replica is gone). Replicas that come and go so leave no connections
// behind; a later forward to the address dials again. A connection that
// is up (a slow owner) is kept for the calls it carries.
func (o *Owners) forget(addr string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if conn, ok := o.conns[addr]; ok && conn.GetState() != connectivity.Ready {
		delete(o.conns, addr)
		_ = conn.Close()
	}
}

// Close closes every connection; later forwards fail as unreachable.
func (o *Owners) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for addr, c := range o.conns {
		_ = c.Close()
		delete(o.conns, addr)
	}
	return nil
}

// outgoing carries the caller's credentials to the owner, which checks them
// against the same client tokens, and marks the call as forwarded.
func outgoing(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.Pairs(ForwardedKey, "1")
	if auth := in.Get("authorization"); len(auth) > 0 {
		out.Set("authorization", auth...)
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// unreachableError is a forward that got no answer from the owner.
type unreachableError struct {
	owner string
	err   error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("runner %s, which runs the instance's agent, did not answer: %v", e.owner, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// answered reports whether err is the owner's own answer rather than the
// transport's: the runner's errors carry an ErrorInfo detail, so an
// UNAVAILABLE the owner chose to send (an instance that moved on) is not
// taken for the owner being down.
func answered(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return true
		}
	}
	return false
}

// forward makes call on owner's replica, with the caller's credentials and
// within the forward timeout. A call that gets no answer (the owner is
// down: its launches are redelivered to other replicas after
// CONCLAVE_RUNNER_LAUNCH_RETRY) fails with an *unreachableError, for the
// caller to fall back; any answer of the owner's, error or not, is
// returned as it is.
func forward[Resp any](ctx context.Context, o *Owners, method, owner string, call func(context.Context, runnerv1.RunnerServiceClient) (Resp, error)) (Resp, error) {
	var zero Resp
	c, err := o.client(owner)
	if err != nil {
		o.metrics.Forwarded(method, ForwardUnreachable)
		return zero, &unreachableError{owner: owner, err: err}
	}
	fctx, cancel := context.WithTimeout(outgoing(ctx), o.timeout)
	defer cancel()
	resp, err := call(fctx, c)
	switch code := status.Code(err); {
	case err == nil:
		o.metrics.Forwarded(method, ForwardOK)
		return resp, nil
	case ctx.Err() != nil:
		// The caller left; nothing to fall back for.
		return zero, status.FromContextError(ctx.Err()).Err()
	case (code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled) && !answered(err):
		// Canceled, the caller being still there: the connection was
		// closed under the call, by forget or Close.
		o.metrics.Forwarded(method, ForwardUnreachable)
		o.forget(owner)
		o.log.WarnContext(ctx, "runner: the replica running an instance's agent did not answer", "method", method, "owner", owner, "error", err)
		return zero, &unreachableError{owner: owner, err: err}
	default:
		o.metrics.Forwarded(method, ForwardError)
		return zero, err
	}
}

// elsewhere reports the owner a supervisor error names, for a call to be
// forwarded there: never for a call that was forwarded already.
func (s *Server) elsewhere(ctx context.Context, err error) (string, bool) {
	var e *supervisor.ErrElsewhere
	if err == nil || !errors.As(err, &e) || forwarded(ctx) {
		return "", false
	}
	return e.Owner, true
}

// forwardCancel asks the owner to cancel. An owner that cannot be reached
// has its launch redelivered to another replica: the cancel is written to
// the store, so that the redelivered launch ends the turn stopped instead
// of running it.
func (s *Server) forwardCancel(ctx context.Context, req *runnerv1.CancelAgentRequest, owner string) (*runnerv1.CancelAgentResponse, error) {
	id := req.GetInstanceId()
	resp, err := forward(ctx, s.owners, ForwardCancel, owner, func(ctx context.Context, c runnerv1.RunnerServiceClient) (*runnerv1.CancelAgentResponse, error) {
		return c.CancelAgent(ctx, req)
	})
	if !errors.As(err, new(*unreachableError)) {
		return resp, err
	}
	in, err := s.sup.CancelStored(ctx, id, req.GetReason())
	if err != nil {
		return nil, fromSupervisor(err, "instance "+id)
	}
	// A redelivery claimed just before the write above started the turn
	// without seeing the cancel: the replica that claimed it is told too.
	// One claimed after it sees the cancel.
	if s.sup.Live(id) {
		if in, err = s.sup.Cancel(ctx, id, req.GetReason()); err != nil {
			return nil, fromSupervisor(err, "instance "+id)
		}
	} else if next := s.sup.RemoteOwner(in); next != "" && next != owner {
		if resp, err := forward(ctx, s.owners, ForwardCancel, next, func(ctx context.Context, c runnerv1.RunnerServiceClient) (*runnerv1.CancelAgentResponse, error) {
			return c.CancelAgent(ctx, req)
		}); err == nil {
			return resp, nil
		}
	}
	return &runnerv1.CancelAgentResponse{Id: in.ID, Status: in.Status}, nil
}
