package acp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// floodAgent starts examples/acp-agent streaming n chunks per turn. The
// benchmarks below measure reading and parsing a real child's stdout pipe,
// with the child on the same two cores.
func floodAgent(b *testing.B, n int) *exec.Cmd {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "acp-bench-")
		if err != nil {
			buildErr = err
			return
		}
		agentBin = filepath.Join(dir, "acp-agent")
		buildErr = testenv.GoBuild(context.Background(), agentBin, "./examples/acp-agent")
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return exec.Command(agentBin, "-dialect", "acp", "-flood", strconv.Itoa(n))
}

var (
	buildOnce sync.Once
	agentBin  string
	buildErr  error
)

func pipes(b *testing.B, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return stdin, stdout
}

// perTurn is how many chunks the agent streams per prompt turn. The SDK's
// connection queues at most 1024 notifications and closes itself when a
// faster agent overflows that, so turns stay under it for the comparison to
// run at all.
const perTurn = 1000

func turnsFor(n int) int { return (n + perTurn - 1) / perTurn }

// BenchmarkNotifications: one op is one session/update read from the pipe,
// parsed and handed over, in turns of perTurn chunks (b.N is rounded up to
// whole turns). Side by side: this package's client, the SDK's client
// connection (github.com/coder/acp-go-sdk), and bare line reading as the
// floor.
func BenchmarkNotifications(b *testing.B) {
	ctx := context.Background()
	b.Run("conclave", func(b *testing.B) {
		stdin, stdout := pipes(b, floodAgent(b, perTurn))
		var n atomic.Int64
		c := New(stdout, stdin, Options{Dialect: DialectACP, OnUpdate: func(_ context.Context, u Update) {
			if u.Kind == KindContent && u.Text != "" {
				n.Add(1)
			}
		}})
		defer c.Close()
		if err := c.Initialize(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := c.NewSession(ctx, os.TempDir()); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range turnsFor(b.N) {
			if _, err := c.Prompt(ctx, "go", 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if int(n.Load()) != turnsFor(b.N)*perTurn {
			b.Fatalf("%d updates, want %d", n.Load(), turnsFor(b.N)*perTurn)
		}
		b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "notifications/s")
	})
	b.Run("acp-go-sdk", func(b *testing.B) {
		stdin, stdout := pipes(b, floodAgent(b, perTurn))
		client := &countingClient{}
		conn := sdk.NewClientSideConnection(client, stdin, stdout)
		if _, err := conn.Initialize(ctx, sdk.InitializeRequest{ProtocolVersion: sdk.ProtocolVersionNumber}); err != nil {
			b.Fatal(err)
		}
		sess, err := conn.NewSession(ctx, sdk.NewSessionRequest{Cwd: os.TempDir(), McpServers: []sdk.McpServer{}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range turnsFor(b.N) {
			if _, err := conn.Prompt(ctx, sdk.PromptRequest{SessionId: sess.SessionId, Prompt: []sdk.ContentBlock{sdk.TextBlock("go")}}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if int(client.n.Load()) != turnsFor(b.N)*perTurn {
			b.Fatalf("%d updates, want %d", client.n.Load(), turnsFor(b.N)*perTurn)
		}
		b.ReportMetric(float64(client.n.Load())/b.Elapsed().Seconds(), "notifications/s")
	})
	b.Run("bare-lines", func(b *testing.B) {
		stdin, stdout := pipes(b, floodAgent(b, perTurn))
		w := bufio.NewWriter(stdin)
		w.WriteString(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}` + "\n")
		w.WriteString(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}` + "\n")
		w.Flush()
		sc := bufio.NewScanner(stdout)
		sc.Scan()
		sc.Scan()
		b.ReportAllocs()
		b.ResetTimer()
		// One prompt at a time, as the clients above: each turn's chunks
		// and its response.
		for i := range turnsFor(b.N) {
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}`+"\n", 3+i)
			w.Flush()
			for range perTurn + 1 {
				if !sc.Scan() {
					b.Fatal("the agent stopped")
				}
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(turnsFor(b.N)*perTurn)/b.Elapsed().Seconds(), "notifications/s")
	})
}

type countingClient struct{ n atomic.Int64 }

func (c *countingClient) SessionUpdate(_ context.Context, n sdk.SessionNotification) error {
	if n.Update.AgentMessageChunk != nil && n.Update.AgentMessageChunk.Content.Text != nil {
		c.n.Add(1)
	}
	return nil
}

func (*countingClient) RequestPermission(context.Context, sdk.RequestPermissionRequest) (sdk.RequestPermissionResponse, error) {
	return sdk.RequestPermissionResponse{}, nil
}
func (*countingClient) ReadTextFile(context.Context, sdk.ReadTextFileRequest) (sdk.ReadTextFileResponse, error) {
	return sdk.ReadTextFileResponse{}, nil
}
func (*countingClient) WriteTextFile(context.Context, sdk.WriteTextFileRequest) (sdk.WriteTextFileResponse, error) {
	return sdk.WriteTextFileResponse{}, nil
}
func (*countingClient) CreateTerminal(context.Context, sdk.CreateTerminalRequest) (sdk.CreateTerminalResponse, error) {
	return sdk.CreateTerminalResponse{}, nil
}
func (*countingClient) KillTerminal(context.Context, sdk.KillTerminalRequest) (sdk.KillTerminalResponse, error) {
	return sdk.KillTerminalResponse{}, nil
}
func (*countingClient) TerminalOutput(context.Context, sdk.TerminalOutputRequest) (sdk.TerminalOutputResponse, error) {
	return sdk.TerminalOutputResponse{}, nil
}
func (*countingClient) ReleaseTerminal(context.Context, sdk.ReleaseTerminalRequest) (sdk.ReleaseTerminalResponse, error) {
	return sdk.ReleaseTerminalResponse{}, nil
}
func (*countingClient) WaitForTerminalExit(context.Context, sdk.WaitForTerminalExitRequest) (sdk.WaitForTerminalExitResponse, error) {
	return sdk.WaitForTerminalExitResponse{}, nil
}
