package api

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// An error the owner sent (with the runner's ErrorInfo) is its answer, to
// be passed on; the transport's UNAVAILABLE is no answer at all.
func TestAnswered(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the owner's own unavailable", apiError(codes.Unavailable, CodeUnavailable, "moved on", ""), true},
		{"the owner's not found", notFound("instance x"), true},
		{"connection refused", status.Error(codes.Unavailable, "connection error: dial tcp 127.0.0.1:1: connect: connection refused"), false},
		{"deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{"not a status", errors.New("plain"), false},
	} {
		if got := answered(c.err); got != c.want {
			t.Errorf("%s: answered = %v, want %v", c.name, got, c.want)
		}
	}
}

// A forwarded call carries the caller's token and the loop guard's mark,
// and nothing else of the caller's metadata.
func TestOutgoing(t *testing.T) {
	t.Parallel()
	in := metadata.Pairs("authorization", "Bearer secret", "x-other", "kept here")
	ctx := outgoing(metadata.NewIncomingContext(context.Background(), in))
	out, _ := metadata.FromOutgoingContext(ctx)
	if got := out.Get("authorization"); len(got) != 1 || got[0] != "Bearer secret" {
		t.Errorf("authorization %q", got)
	}
	if got := out.Get(ForwardedKey); len(got) != 1 || got[0] != "1" {
		t.Errorf("%s %q", ForwardedKey, got)
	}
	if got := out.Get("x-other"); len(got) != 0 {
		t.Errorf("x-other was passed on: %q", got)
	}
	if forwarded(context.Background()) || !forwarded(metadata.NewIncomingContext(context.Background(), out)) {
		t.Error("forwarded() does not read the mark")
	}
}

type countedForwards map[string]int

func (c countedForwards) Forwarded(method, outcome string) { c[method+" "+outcome]++ }

// A forward to an address nothing listens on is unreachable, counted, and
// leaves no connection behind.
func TestForwardToNobody(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	counts := countedForwards{}
	o := NewOwners(5*time.Second, counts, slog.New(slog.DiscardHandler), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer o.Close()
	_, err = forward(context.Background(), o, ForwardCancel, addr, func(ctx context.Context, c runnerv1.RunnerServiceClient) (*runnerv1.CancelAgentResponse, error) {
		return c.CancelAgent(ctx, &runnerv1.CancelAgentRequest{InstanceId: "x"})
	})
	if u := (*unreachableError)(nil); !errors.As(err, &u) || u.owner != addr {
		t.Fatalf("forward to nobody: %v, want unreachable %s", err, addr)
	}
	if counts[ForwardCancel+" "+ForwardUnreachable] != 1 {
		t.Errorf("counted %v", counts)
	}
	o.mu.Lock()
	left := len(o.conns)
	o.mu.Unlock()
	if left != 0 {
		t.Errorf("%d connections kept to a replica that is gone", left)
	}
	o.Close()
	if _, err := o.client(addr); !errors.Is(err, errOwnersClosed) {
		t.Errorf("client after Close: %v", err)
	}
}
