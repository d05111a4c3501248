package bus

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/coder/websocket"
)

// idleClients is how many connections BenchmarkIdleConnectionMemory holds:
// 19,000, or fewer when the open-file limit (20,000 on the bench machine,
// which the bus's listener and store also use) is lower.
func idleClients() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1000
	}
	return int(min(19000, max(int64(lim.Cur)-200, 100)))
}

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
	n := idleClients()
	before := heapAndStacks()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "BENCH_BUS_IDLE_CLIENTS_URL="+url, "BENCH_BUS_IDLE_CLIENTS="+strconv.Itoa(n))
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
	b.ReportMetric(float64(after-before)/float64(n), "bytes/conn")
	b.ReportMetric(float64(runtime.NumGoroutine())/float64(n), "goroutines/conn")
	b.ReportMetric(float64(n), "conns")
	_ = stdin.Close()
	_ = child.Wait()
}
