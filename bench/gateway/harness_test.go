package gateway_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

const token = "bench-token-0123456789"

// target is one server under test: the real gateway or the relay floor.
type target struct {
	name string
	addr string
	http string // the REST listener's address (the gateway's only)
	stop func()
	// writes counts the writes the gateway sent its store (nil for the
	// floor, which has none).
	writes func() int64
}

// countingStore counts the writes that reach the real store.
type countingStore struct {
	store.Store
	n atomic.Int64
}

func (c *countingStore) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	c.n.Add(1)
	return c.Store.Put(ctx, table, it, conds...)
}

func (c *countingStore) Delete(ctx context.Context, table string, k store.Key, conds ...store.Condition) error {
	c.n.Add(1)
	return c.Store.Delete(ctx, table, k, conds...)
}

func (c *countingStore) Add(ctx context.Context, table string, k store.Key, delta int64, exp time.Time) (int64, error) {
	c.n.Add(1)
	return c.Store.Add(ctx, table, k, delta, exp)
}

// tempDir prefers tmpfs, so that the registry's bbolt commits (one fsync per
// agent registration) measure the gateway rather than the virtual disk.
func tempDir(b *testing.B) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "conclave-bench-gateway-")
		if err == nil {
			b.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return b.TempDir()
}

// startGateway runs a real gateway (service.New, as cmd/gateway does) on
// loopback with an embedded store and bearer-token authentication.
func startGateway(b *testing.B) *target {
	b.Helper()
	return startGatewayAt(b, "127.0.0.1:0", boltAt(filepath.Join(tempDir(b), "state.db")))
}

// storeOpener opens the gateway's store; each gateway process of a bench
// opens its own.
type storeOpener func() (store.Store, error)

// boltAt opens the embedded store file at path.
func boltAt(path string) storeOpener {
	return func() (store.Store, error) { return store.OpenBolt(path, store.BoltOptions{}) }
}

// dynamoAt opens DynamoDB at endpoint (dynalite) with the HTTP client
// storage.Open gives a deployed gateway.
func dynamoAt(endpoint string) storeOpener {
	return func() (store.Store, error) {
		cfg := testenv.AWSConfig()
		cfg.HTTPClient = store.HTTPClient()
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(endpoint) })
		return store.NewDynamo(client, store.DynamoOptions{Endpoint: endpoint}), nil
	}
}

// startGatewayAt runs the gateway on grpcAddr with the store open gives, on
// cmd/gateway's default timings (lease 15s, agent timeout 90s), history
// off unless tune turns it on.
func startGatewayAt(b *testing.B, grpcAddr string, open storeOpener, tune ...func(*service.Config)) *target {
	b.Helper()
	return startGatewayOpts(b, grpcAddr, open, nil, tune...)
}

// startGatewayOpts is startGatewayAt with grpcOpts added to the gateway's
// gRPC server options, after its own, so that they take precedence.
func startGatewayOpts(b *testing.B, grpcAddr string, open storeOpener, grpcOpts []grpc.ServerOption, tune ...func(*service.Config)) *target {
	b.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-bench"})
	if err != nil {
		b.Fatal(err)
	}
	backend, err := open()
	if err != nil {
		b.Fatal(err)
	}
	st := &countingStore{Store: backend}
	if err := store.EnsureTables(context.Background(), st, service.Tables...); err != nil {
		b.Fatal(err)
	}
	cfg := service.Config{
		GRPCAddr: config.ListenAddr(grpcAddr), HTTPAddr: "127.0.0.1:0", ServerID: "gw-bench",
		RegisterTimeout: 10 * time.Second, AgentTimeout: 90 * time.Second, ShutdownTimeout: 5 * time.Second,
		QueueDepth: 32, CancelGrace: 30 * time.Second, Lease: 15 * time.Second, ClientTokens: []string{token},
		AllowAgentsWithoutTokens: true,
		// Every bench client shares one token; the per-client limits are
		// set out of reach so that the bench measures the gateway, not them.
		ClientRate: 1e9, ClientBurst: 1 << 30, ClientStreams: 1 << 20,
		// The rest at the defaults the gateway took for zero before New
		// checked its Config.
		KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second, MaxHeartbeats: 50,
		IdempotencyTTL: 24 * time.Hour, HistoryFlush: time.Second, DetachedTimeout: 10 * time.Minute,
	}
	for _, f := range tune {
		f(&cfg)
	}
	gw, err := service.New(cfg, service.Deps{Store: st, Logger: slog.New(slog.DiscardHandler), Telemetry: tel},
		server.WithGRPCOptions(grpcOpts...))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	<-gw.Ready()
	var addr, httpAddr string
	for _, e := range gw.Endpoints() {
		switch {
		case strings.HasPrefix(e.Protocol, "gRPC"):
			addr = e.Address
		case strings.HasPrefix(e.Protocol, "HTTP"):
			httpAddr = e.Address
		}
	}
	return &target{name: "gateway", addr: addr, http: httpAddr, writes: st.n.Load, stop: func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("gateway run: %v", err)
		}
		_ = st.Close()
		_ = tel.Shutdown(context.Background())
	}}
}

func dial(b *testing.B, addr string) *grpc.ClientConn {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	conn.Connect()
	return conn
}

func authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// register opens an AgentStream and registers id; it returns once welcomed.
func register(ctx context.Context, conn *grpc.ClientConn, id string) (grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage], error) {
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, Name: "bench", Capabilities: []string{"chat"},
	}}}); err != nil {
		return nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if m.GetWelcome() == nil {
		return nil, fmt.Errorf("register %s: got %v", id, m)
	}
	return stream, nil
}

// startAgent registers id and answers every SendMessage with n text events
// and done, n being the request's content as a number (1 if it is not one).
func startAgent(b *testing.B, ctx context.Context, conn *grpc.ClientConn, id string) {
	b.Helper()
	stream, err := register(ctx, conn, id)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		text := &covenpb.AgentMessage{}
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			req := m.GetSendMessage()
			if req == nil {
				continue
			}
			n, err := strconv.Atoi(req.Content)
			if err != nil {
				n = 1
			}
			text.Payload = &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
				RequestId: req.RequestId, Event: &covenpb.MessageResponse_Text{Text: "event text, about forty bytes long..."},
			}}
			for range n {
				if stream.Send(text) != nil {
					return
				}
			}
			if stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
				RequestId: req.RequestId, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "done"}},
			}}}) != nil {
				return
			}
		}
	}()
}

// echoClient starts tg's echo agent on a connection of its own and
// returns a client of tg on another, with the context its calls carry
// (authorized); all of it, tg too, ends with the benchmark.
func echoClient(b *testing.B, tg *target) (context.Context, gatewayv1.GatewayServiceClient) {
	b.Cleanup(tg.stop)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	agentConn := dial(b, tg.addr)
	b.Cleanup(func() { _ = agentConn.Close() })
	startAgent(b, ctx, agentConn, "echo")
	clientConn := dial(b, tg.addr)
	b.Cleanup(func() { _ = clientConn.Close() })
	return authed(ctx), gatewayv1.NewGatewayServiceClient(clientConn)
}

// send makes one SendMessage call and reads its stream to the end; it
// returns the number of the agent's events received.
func send(ctx context.Context, client gatewayv1.GatewayServiceClient, agent, content string) (int, error) {
	return sendInThread(ctx, client, agent, "", content)
}

// relay is the floor: the least code that serves GatewayService.SendMessage
// by forwarding to an agent's CovenControl stream. One request at a time per
// agent, responses matched by request_id; no registry, auth, limits,
// queueing, telemetry, logging or interceptors.
type relay struct {
	gatewayv1.UnimplementedGatewayServiceServer
	covenpb.UnimplementedCovenControlServer

	mu     sync.Mutex
	agents map[string]*relayAgent
	seq    atomic.Uint64
}

type relayAgent struct {
	stream grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]
	turn   chan struct{} // one request at a time
	mu     sync.Mutex
	reqID  string
	events chan *covenpb.MessageResponse
}

func (r *relay) AgentStream(stream grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	id := m.GetRegister().GetAgentId()
	a := &relayAgent{stream: stream, turn: make(chan struct{}, 1), events: make(chan *covenpb.MessageResponse, 16)}
	r.mu.Lock()
	r.agents[id] = a
	r.mu.Unlock()
	defer func() { r.mu.Lock(); delete(r.agents, id); r.mu.Unlock() }()
	if err := stream.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{ServerId: "relay", AgentId: id}}}); err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		resp := m.GetResponse()
		if resp == nil {
			continue
		}
		a.mu.Lock()
		match := resp.RequestId == a.reqID
		a.mu.Unlock()
		if match {
			a.events <- resp
		}
	}
}

func (r *relay) SendMessage(req *gatewayv1.SendMessageRequest, out grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	r.mu.Lock()
	a := r.agents[req.AgentId]
	r.mu.Unlock()
	if a == nil {
		return status.Error(codes.NotFound, "no such agent")
	}
	a.turn <- struct{}{}
	defer func() { <-a.turn }()
	// Request ids of the gateway's shape and length (its replica's name, a
	// dot, 24 hex digits): every event carries its request's id both ways,
	// so a floor with shorter ids would send fewer bytes than the coven
	// protocol's globally unique ids need.
	id := fmt.Sprintf("gw-bench.%024x", r.seq.Add(1))
	a.mu.Lock()
	a.reqID = id
	a.mu.Unlock()
	if err := a.stream.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: &covenpb.SendMessage{
		RequestId: id, Content: req.Content,
	}}}); err != nil {
		return err
	}
	for ev := range a.events {
		if err := out.Send(&gatewayv1.SendMessageResponse{RequestId: id, Event: ev}); err != nil {
			return err
		}
		if ev.GetDone() != nil || ev.GetError() != "" {
			return nil
		}
	}
	return nil
}

// startRelay serves the relay floor on loopback with a bare grpc.Server.
func startRelay(b *testing.B) *target {
	b.Helper()
	srv := grpc.NewServer()
	r := &relay{agents: map[string]*relayAgent{}}
	gatewayv1.RegisterGatewayServiceServer(srv, r)
	covenpb.RegisterCovenControlServer(srv, r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	return &target{name: "relay-floor", addr: lis.Addr().String(), stop: func() { srv.Stop(); <-done }}
}
