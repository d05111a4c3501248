package agentstream_test

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

var fuzzGateway struct {
	once   sync.Once
	svc    *agentstream.Service
	client covenpb.CovenControlClient
}

// fuzzTarget is one gateway shared by every fuzz input, as a real one is
// shared by every agent: an input that breaks it breaks the inputs after it.
func fuzzTarget(f *testing.F) (*agentstream.Service, covenpb.CovenControlClient) {
	fuzzGateway.once.Do(func() {
		svc := agentstream.New(agentstream.Options{ServerID: "fuzz"}, slog.New(slog.DiscardHandler))
		lis := bufconn.Listen(1 << 20)
		srv := grpc.NewServer(agentstream.ServerOption())
		covenpb.RegisterCovenControlServer(srv, svc)
		go func() { _ = srv.Serve(lis) }()
		conn, err := grpc.NewClient("passthrough:///fuzz",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			f.Fatal(err)
		}
		fuzzGateway.svc, fuzzGateway.client = svc, covenpb.NewCovenControlClient(conn)
	})
	return fuzzGateway.svc, fuzzGateway.client
}

// frames splits b into length-prefixed protobuf AgentMessages.
func frames(b []byte) []*covenpb.AgentMessage {
	var out []*covenpb.AgentMessage
	for len(b) > 0 && len(out) < 32 {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return out
		}
		m := &covenpb.AgentMessage{}
		if proto.Unmarshal(b[w:w+int(n)], m) == nil {
			out = append(out, m)
		}
		b = b[w+int(n):]
	}
	return out
}

func frame(m *covenpb.AgentMessage) []byte {
	b, _ := proto.Marshal(m)
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

// FuzzAgentStream sends arbitrary message sequences on AgentStream, as a
// buggy or hostile agent would: registrations with odd IDs, responses for
// requests it was never sent, repeated registrations. The stream must end
// with one of the statuses the protocol names, and leave nothing registered.
func FuzzAgentStream(f *testing.F) {
	reg := func(id string) *covenpb.AgentMessage {
		return &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}}
	}
	resp := &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
		RequestId: "fuzz.0", Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}},
	}}}
	hb := &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{TimestampMs: 1}}}
	f.Add(frame(reg("a")))
	f.Add(append(frame(reg("b")), append(frame(resp), frame(hb)...)...))
	f.Add(append(frame(resp), frame(reg("c"))...))
	f.Add(append(frame(reg("d")), frame(reg("d"))...))
	f.Add(frame(reg("")))
	f.Add(frame(&covenpb.AgentMessage{}))
	f.Add([]byte{0xff, 0xff})

	svc, client := fuzzTarget(f)
	allowed := map[codes.Code]bool{
		codes.OK: true, codes.InvalidArgument: true, codes.FailedPrecondition: true, codes.AlreadyExists: true,
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs := frames(b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := client.AgentStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if s.Send(m) != nil {
				break
			}
		}
		_ = s.CloseSend()
		var final error
		for {
			if _, err := s.Recv(); err != nil {
				if err != io.EOF {
					final = err
				}
				break
			}
		}
		if code := status.Code(final); !allowed[code] {
			t.Fatalf("stream ended with %v", final)
		}
		// The stream is over, so its agent must be gone: a leak here would
		// refuse the agent's reconnection forever.
		if n := len(svc.Agents()); n != 0 {
			t.Fatalf("%d agents still registered after their streams ended", n)
		}
	})
}
