// Package jsonrpc_test compares Conclave's JSON-RPC connection with
// github.com/sourcegraph/jsonrpc2 on the same round trip over the same
// transport, so the cost of the hand-written core is measured, not guessed.
package jsonrpc_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"testing"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	sg "github.com/sourcegraph/jsonrpc2"
)

type params struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

var want = params{N: 42, Text: "the quick brown fox jumps over the lazy dog"}

// caller is one side's Call, so every implementation runs the same loop.
type caller func(ctx context.Context, method string, params, result any) error

// The transport for every implementation: net.Pipe, newline-delimited JSON.
// sourcegraph's plain object stream writes each message with json.Encoder,
// which ends it with a newline, and reads consecutive JSON values.

func conclave(b *testing.B) caller {
	c1, c2 := net.Pipe()
	quiet := jsonrpc.WithLogger(slog.New(slog.DiscardHandler))
	client := jsonrpc.NewConn(jsonrpc.NewLineStream(c1, c1, 0), nil, quiet)
	server := jsonrpc.NewConn(jsonrpc.NewLineStream(c2, c2, 0), jsonrpc.HandlerFunc(
		func(_ context.Context, req *jsonrpc.Request) (any, error) {
			var p params
			if err := req.DecodeParams(&p); err != nil {
				return nil, err
			}
			return p, nil
		}), quiet)
	b.Cleanup(func() { client.Close(); server.Close() })
	return client.Call
}

func sourcegraph(async bool) func(b *testing.B) caller {
	return func(b *testing.B) caller {
		c1, c2 := net.Pipe()
		var h sg.Handler = sg.HandlerWithError(func(_ context.Context, _ *sg.Conn, req *sg.Request) (any, error) {
			var p params
			if req.Params != nil {
				if err := json.Unmarshal(*req.Params, &p); err != nil {
					return nil, err
				}
			}
			return p, nil
		})
		if async {
			h = sg.AsyncHandler(h)
		}
		quiet := sg.SetLogger(log.New(io.Discard, "", 0))
		ctx := context.Background()
		client := sg.NewConn(ctx, sg.NewPlainObjectStream(c1), nil, quiet)
		server := sg.NewConn(ctx, sg.NewPlainObjectStream(c2), h, quiet)
		b.Cleanup(func() { client.Close(); server.Close() })
		return func(ctx context.Context, method string, params, result any) error {
			return client.Call(ctx, method, params, result)
		}
	}
}

var impls = []struct {
	name string
	new  func(b *testing.B) caller
}{
	{"conclave", conclave},
	// Async runs each request on its own goroutine, as conclave does; sync
	// runs it on the read loop, cheaper but one request at a time.
	{"sourcegraph-async", sourcegraph(true)},
	{"sourcegraph-sync", sourcegraph(false)},
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			call := impl.new(b)
			b.ReportAllocs()
			var got params
			for b.Loop() {
				if err := call(b.Context(), "echo", want, &got); err != nil {
					b.Fatal(err)
				}
			}
			if got != want {
				b.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

func BenchmarkRoundTripParallel(b *testing.B) {
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			call := impl.new(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var got params
				for pb.Next() {
					if err := call(b.Context(), "echo", want, &got); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
