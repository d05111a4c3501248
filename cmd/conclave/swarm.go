package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// swarmOptions configure `conclave agent swarm`.
type swarmOptions struct {
	addr        string
	count       int
	prefix      string
	perConn     int
	parallel    int
	reconnect   bool
	reportEvery time.Duration
}

func parseSwarmArgs(args []string, stderr io.Writer) (swarmOptions, error) {
	var o swarmOptions
	fs := flag.NewFlagSet("conclave agent swarm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Usage: conclave agent swarm [flags]

Holds --count idle coven agents on the gateway, each on its own AgentStream,
for load tests: it registers them, then holds them, printing one JSON
object per line: "registered" once all are welcomed, and "status" every
--report and whenever a line arrives on stdin. It stops when stdin closes.`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "localhost:50051", "the gateway's gRPC address")
	fs.IntVar(&o.count, "count", 1000, "how many agents to hold")
	fs.StringVar(&o.prefix, "prefix", "swarm-", "agent IDs are this prefix and a number")
	fs.IntVar(&o.perConn, "per-conn", 100, "agent streams per gRPC connection")
	fs.IntVar(&o.parallel, "parallel", 256, "registrations in flight at once")
	fs.BoolVar(&o.reconnect, "reconnect", false, "register an agent again when its stream ends, as a real agent would")
	fs.DurationVar(&o.reportEvery, "report", 0, "print a status line this often (0: only when asked on stdin)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("agent swarm: unexpected argument %q", fs.Arg(0))
	case o.count < 1 || o.perConn < 1 || o.parallel < 1:
		return o, errors.New("agent swarm: --count, --per-conn and --parallel must be positive")
	}
	return o, nil
}

// swarmStatus is what the swarm reports: how many agents are registered
// now, and what the gateway did to them since they first registered.
type swarmStatus struct {
	Event string `json:"event"`
	// Registered agents hold a welcomed stream now.
	Registered int64 `json:"registered"`
	// Shutdowns counts Shutdown messages received; Ended counts streams
	// the gateway ended.
	Shutdowns int64 `json:"shutdowns"`
	Ended     int64 `json:"ended"`
	// Registrations counts every Welcome, first ones included.
	Registrations int64 `json:"registrations"`
	// Seconds is how long the first registration of all took ("registered").
	Seconds float64 `json:"seconds,omitempty"`
}

type swarm struct {
	opts                                        swarmOptions
	registered, shutdowns, ended, registrations atomic.Int64
	out                                         *json.Encoder
	outMu                                       sync.Mutex
}

func (s *swarm) report(event string, seconds float64) {
	st := swarmStatus{Event: event, Registered: s.registered.Load(), Shutdowns: s.shutdowns.Load(),
		Ended: s.ended.Load(), Registrations: s.registrations.Load(), Seconds: seconds}
	s.outMu.Lock()
	defer s.outMu.Unlock()
	_ = s.out.Encode(st)
}

// runSwarm holds the agents until ctx ends or stdin closes.
func runSwarm(ctx context.Context, o swarmOptions, stdin io.Reader, stdout io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &swarm{opts: o, out: json.NewEncoder(stdout)}
	conns := make([]*grpc.ClientConn, (o.count+o.perConn-1)/o.perConn)
	for i := range conns {
		c, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("agent swarm: gateway address %q: %w", o.addr, err)
		}
		defer c.Close()
		conns[i] = c
	}
	start := time.Now()
	sem := make(chan struct{}, o.parallel)
	var all sync.WaitGroup
	var first sync.WaitGroup
	first.Add(o.count)
	for i := range o.count {
		all.Go(func() {
			s.agent(ctx, covenpb.NewCovenControlClient(conns[i/o.perConn]), fmt.Sprintf("%s%d", o.prefix, i), sem, first.Done)
		})
	}
	firstDone := make(chan struct{})
	go func() { first.Wait(); close(firstDone) }()
	select {
	case <-firstDone:
		s.report("registered", time.Since(start).Seconds())
	case <-ctx.Done():
		all.Wait()
		return ctx.Err()
	}
	lines := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- struct{}{}
		}
		cancel()
	}()
	var tick <-chan time.Time
	if o.reportEvery > 0 {
		t := time.NewTicker(o.reportEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			all.Wait()
			return nil
		case <-lines:
			s.report("status", 0)
		case <-tick:
			s.report("status", 0)
		}
	}
}

// agent registers id, retrying what a real agent retries (a replica not
// ready yet, a registration not yet expired), and reads its stream until it
// ends; with --reconnect it then starts again.
func (s *swarm) agent(ctx context.Context, client covenpb.CovenControlClient, id string, sem chan struct{}, registered func()) {
	once := sync.OnceFunc(registered)
	defer once() // an agent that gives up still counts, so the swarm can report
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		sem <- struct{}{}
		stream, err := s.register(sctx, client, id)
		<-sem
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return
			}
			switch status.Code(err) {
			case codes.Unavailable, codes.AlreadyExists, codes.DeadlineExceeded, codes.ResourceExhausted:
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			fmt.Fprintf(os.Stderr, "agent swarm: %s: %v\n", id, err)
			return
		}
		backoff = 50 * time.Millisecond
		s.registered.Add(1)
		s.registrations.Add(1)
		once()
		for {
			m, err := stream.Recv()
			if err != nil {
				break
			}
			if m.GetShutdown() != nil {
				s.shutdowns.Add(1)
				if s.opts.reconnect {
					break // go elsewhere at once, as Shutdown asks
				}
			}
		}
		cancel()
		s.registered.Add(-1)
		if ctx.Err() != nil {
			return
		}
		s.ended.Add(1)
		if !s.opts.reconnect {
			return
		}
	}
}

func (s *swarm) register(ctx context.Context, client covenpb.CovenControlClient, id string) (covenpb.CovenControl_AgentStreamClient, error) {
	stream, err := client.AgentStream(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, Name: id, Capabilities: []string{"idle"},
	}}}); err != nil {
		_, err = stream.Recv()
		return nil, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if m.GetWelcome() != nil {
			return stream, nil
		}
	}
}
