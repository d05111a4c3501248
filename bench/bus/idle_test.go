package bus

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"github.com/coder/websocket"
)

// idleClients is how many connections BenchmarkIdleConnectionMemory holds.
// The machine's hard limit of open files per process is 20,000, which the
// bus's listener and store also need a few of, hence not 20,000.
const idleClients = 19000

// TestMain lets the benchmark run this binary as the child holding the
// client ends of the idle connections.
func TestMain(m *testing.M) {
	if url := os.Getenv("BENCH_BUS_IDLE_CLIENTS_URL"); url != "" {
		os.Exit(holdClients(url))
	}
	os.Exit(m.Run())
}

// holdClients opens idleClients initialized connections, says "ready",
// and holds them until stdin closes.
func holdClients(url string) int {
	n, _ := strconv.Atoi(os.Getenv("BENCH_BUS_IDLE_CLIENTS"))
	conns := make([]*websocket.Conn, 0, n)
	for i := range n {
		c, _, err := websocket.Dial(context.Background(), url, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			return 1
		}
		init := fmt.Sprintf(`{"jsonrpc":"2.0","method":"initialize","params":{"clientId":"idle-%d"},"id":1}`, i)
		if err := c.Write(context.Background(), websocket.MessageText, []byte(init)); err != nil {
			return 1
		}
		if _, _, err := c.Read(context.Background()); err != nil {
			return 1
		}
		conns = append(conns, c)
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	for _, c := range conns {
		_ = c.CloseNow()
	}
	return 0
}

func heapAndStacks() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// BenchmarkIdleConnectionMemory measures the bus's memory per idle
// initialized connection, the clients held by a child process so that
// only the bus's side is counted.
func BenchmarkIdleConnectionMemory(b *testing.B) {
	url := startBus(b)
	before := heapAndStacks()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "BENCH_BUS_IDLE_CLIENTS_URL="+url, "BENCH_BUS_IDLE_CLIENTS="+strconv.Itoa(idleClients))
	stdin, err := child.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		b.Fatalf("child: %q %v", line, err)
	}
	after := heapAndStacks()
	for b.Loop() {
	}
	b.ReportMetric(float64(after-before)/idleClients, "bytes/conn")
	b.ReportMetric(float64(runtime.NumGoroutine())/idleClients, "goroutines/conn")
	_ = stdin.Close()
	_ = child.Wait()
}
