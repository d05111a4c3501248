// Package agent is a small coven agent: it holds an AgentStream with a
// gateway, answers each message with a scripted reply that uses every kind
// of event, honours cancellation and Shutdown, and reconnects under the same
// agent ID whenever the stream ends.
package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Config is what the agent needs to know. Zero fields take the defaults
// named on them.
type Config struct {
	// Addr is the gateway's gRPC address (default localhost:50051).
	Addr string
	// AgentID identifies the agent across reconnects (default: a random
	// UUID, fixed for the life of Run).
	AgentID string
	// Name is shown in logs and UIs (default coven-agent).
	Name string
	// Capabilities are advertised at registration (default chat).
	Capabilities []string
	// Token, when set, is sent as "authorization: Bearer <token>".
	Token string
	// Heartbeat is how often the agent proves it is alive (default 20s); the
	// gateway drops agents silent for 90s by default.
	Heartbeat time.Duration
	// StepDelay is the pause between the events of a reply (default none).
	StepDelay time.Duration
	// MinBackoff and MaxBackoff bound the wait before reconnecting (default
	// 500ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the agent's logs (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = "localhost:50051"
	}
	if c.AgentID == "" {
		c.AgentID = NewID()
	}
	if c.Name == "" {
		c.Name = "coven-agent"
	}
	if len(c.Capabilities) == 0 {
		c.Capabilities = []string{"chat"}
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 20 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 500 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// NewID returns a random version-4 UUID, the form the coven protocol recommends for
// agent IDs.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail; it crashes the program instead
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Run keeps the agent connected to the gateway until ctx ends, then closes
// its stream cleanly and returns nil. It returns an error only for what
// reconnecting cannot fix: a gateway that rejects the agent's ID or
// credentials.
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	conn, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("gateway address %q: %w", cfg.Addr, err)
	}
	defer conn.Close()
	if cfg.Token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cfg.Token)
	}
	r := &runner{
		client: covenpb.NewCovenControlClient(conn),
		cfg:    cfg,
		log:    cfg.Logger.With("agent_id", cfg.AgentID),
		registration: &covenpb.RegisterAgent{
			AgentId:          cfg.AgentID,
			Name:             cfg.Name,
			Capabilities:     cfg.Capabilities,
			Metadata:         hostMetadata(),
			ProtocolFeatures: []string{"cancellation"},
		},
	}
	bo := backoff{min: cfg.MinBackoff, max: cfg.MaxBackoff}
	for {
		welcomed, err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied:
			return fmt.Errorf("gateway %s refused agent %s: %w", cfg.Addr, cfg.AgentID, err)
		}
		if welcomed {
			bo.reset()
		}
		wait := bo.next()
		r.log.WarnContext(ctx, "disconnected from the gateway; reconnecting", "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// hostMetadata tells the gateway where the agent runs. It is informational,
// so a host name or directory that cannot be read is left empty.
func hostMetadata() *covenpb.AgentMetadata {
	host, _ := os.Hostname()
	wd, _ := os.Getwd()
	return &covenpb.AgentMetadata{Hostname: host, Os: runtime.GOOS, WorkingDirectory: wd}
}

type runner struct {
	client       covenpb.CovenControlClient
	cfg          Config
	log          *slog.Logger
	registration *covenpb.RegisterAgent
}

// session is one AgentStream from open to end. welcomed reports whether the
// gateway accepted the registration, which makes the next reconnect prompt.
func (r *runner) session(ctx context.Context) (welcomed bool, err error) {
	// The stream is not bound to ctx: when the agent stops it still answers
	// its in-flight request and closes its side, so the gateway sees a clean
	// goodbye instead of a reset.
	sctx, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	// Until the Welcome there is nothing to wind down.
	stopRegistering := context.AfterFunc(ctx, abort)
	st, err := r.client.AgentStream(sctx)
	if err != nil {
		stopRegistering()
		return false, fmt.Errorf("open AgentStream: %w", err)
	}
	w, err := register(st, r.registration)
	if !stopRegistering() || err != nil {
		return false, err
	}
	r.log.InfoContext(ctx, "registered with the gateway", "server_id", w.GetServerId(), "instance_id", w.GetInstanceId())
	s := &session{
		stream:    st,
		abort:     abort,
		log:       r.log.With("instance_id", w.GetInstanceId()),
		replier:   replier{delay: r.cfg.StepDelay, now: time.Now},
		heartbeat: r.cfg.Heartbeat,
	}
	return true, s.serve(ctx)
}

// register sends RegisterAgent and waits for the gateway's answer.
func register(st stream, reg *covenpb.RegisterAgent) (*covenpb.Welcome, error) {
	if err := st.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: reg}}); err != nil {
		return nil, fmt.Errorf("send RegisterAgent: %w", sendErr(st, err))
	}
	m, err := st.Recv()
	if err != nil {
		return nil, fmt.Errorf("await Welcome: %w", err)
	}
	switch p := m.GetPayload().(type) {
	case *covenpb.ServerMessage_Welcome:
		return p.Welcome, nil
	case *covenpb.ServerMessage_RegistrationError:
		// The gateway ends the stream next, and its status carries the code
		// (ALREADY_EXISTS, UNAVAILABLE) that says whether to retry.
		if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("registration refused: %w", err)
		}
		return nil, fmt.Errorf("registration refused: %s", p.RegistrationError.GetReason())
	default:
		return nil, fmt.Errorf("expected Welcome, got %T", p)
	}
}

// sendErr turns the io.EOF a gRPC Send returns when the server has ended the
// stream into the status the server ended it with.
func sendErr(st stream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if _, rerr := st.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
		return rerr
	}
	return err
}

// backoff is exponential with jitter: each wait is drawn from the upper half
// of a window that doubles up to max, so agents dropped together by one
// replica do not all come back at the same instant, yet none spins.
type backoff struct {
	min, max time.Duration
	window   time.Duration
}

func (b *backoff) next() time.Duration {
	if b.window == 0 {
		b.window = b.min
	} else {
		b.window = min(2*b.window, b.max)
	}
	return b.window/2 + mrand.N(b.window/2+1)
}

func (b *backoff) reset() { b.window = 0 }
