// Package queue compares the two backends of pkg/queue on the operations
// every consumer repeats: send, receive and delete. The embedded backend is
// measured on a bbolt file (every call committed and fsynced), the SQS
// backend against fauxqs on loopback, so the SQS figures are the SDK and
// HTTP cost, not AWS's latency.
package queue_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

var fauxqs *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	c, err := testenv.Fauxqs(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "queue benchmarks:", err)
		return 1
	}
	defer c.Stop()
	fauxqs = c
	return m.Run()
}

type backend struct {
	name string
	open func(b *testing.B) queue.Queue
}

var backends = []backend{
	{"embedded", func(b *testing.B) queue.Queue {
		e, err := queue.OpenEmbedded(filepath.Join(b.TempDir(), "queues.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close() })
		return e
	}},
	{"sqs-fauxqs", func(*testing.B) queue.Queue {
		cfg := aws.Config{
			Region: "us-east-1",
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "bench", SecretAccessKey: "bench"}, nil
			}),
		}
		return queue.NewSQS(cfg, fauxqs.Endpoint)
	}},
}

var seq atomic.Int64

// newQueue ensures a fresh queue with a visibility long enough that nothing
// is redelivered during a run.
func newQueue(b *testing.B, q queue.Queue) string {
	b.Helper()
	name := fmt.Sprintf("bench-%d", seq.Add(1))
	if err := q.Ensure(context.Background(), queue.Definition{Name: name, VisibilityTimeout: time.Hour}); err != nil {
		b.Fatal(err)
	}
	return name
}

// payload is a typical event envelope's size.
var payload = []byte(`{"type":"task.status","task_id":"` + strings.Repeat("t", 36) + `","status":"running","at":"2026-01-01T00:00:00Z","detail":"` + strings.Repeat("x", 200) + `"}`)

// fill sends n messages in batches, outside the timed part.
func fill(b *testing.B, q queue.Queue, name string, n int) {
	b.Helper()
	const chunk = 500
	msgs := make([]queue.Outgoing, chunk)
	for i := range msgs {
		msgs[i] = queue.Outgoing{Body: payload}
	}
	for n > 0 {
		k := min(n, chunk)
		if _, err := q.Send(context.Background(), name, msgs[:k]...); err != nil {
			b.Fatal(err)
		}
		n -= k
	}
}

func BenchmarkSend(b *testing.B) {
	for _, be := range backends {
		for _, batch := range []int{1, 10} {
			b.Run(fmt.Sprintf("%s/batch=%d", be.name, batch), func(b *testing.B) {
				q := be.open(b)
				name := newQueue(b, q)
				msgs := make([]queue.Outgoing, batch)
				for i := range msgs {
					msgs[i] = queue.Outgoing{Body: payload, Attributes: map[string]string{"type": "task.status"}}
				}
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if _, err := q.Send(ctx, name, msgs...); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

func BenchmarkReceive(b *testing.B) {
	for _, be := range backends {
		for _, batch := range []int{1, 10} {
			b.Run(fmt.Sprintf("%s/batch=%d", be.name, batch), func(b *testing.B) {
				q := be.open(b)
				name := newQueue(b, q)
				fill(b, q, name, b.N*batch)
				ctx := context.Background()
				opts := queue.ReceiveOptions{Max: batch, Wait: time.Second}
				b.ReportAllocs()
				b.ResetTimer()
				got := 0
				for got < b.N*batch {
					msgs, err := q.Receive(ctx, name, opts)
					if err != nil {
						b.Fatal(err)
					}
					got += len(msgs)
				}
				b.ReportMetric(float64(got)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

func BenchmarkDelete(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			q := be.open(b)
			name := newQueue(b, q)
			fill(b, q, name, b.N)
			ctx := context.Background()
			handles := make([]string, 0, b.N)
			for len(handles) < b.N {
				msgs, err := q.Receive(ctx, name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range msgs {
					handles = append(handles, m.ReceiptHandle)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, h := range handles {
				if err := q.Delete(ctx, name, h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeleteParallel deletes from GOMAXPROCS×4 goroutines, as a
// consumer with several workers does; the embedded backend shares commits
// between concurrent calls, which this shows.
func BenchmarkDeleteParallel(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			q := be.open(b)
			name := newQueue(b, q)
			fill(b, q, name, b.N)
			ctx := context.Background()
			handles := make(chan string, b.N)
			for n := 0; n < b.N; {
				msgs, err := q.Receive(ctx, name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range msgs {
					handles <- m.ReceiptHandle
					n++
				}
			}
			close(handles)
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := q.Delete(ctx, name, <-handles); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
