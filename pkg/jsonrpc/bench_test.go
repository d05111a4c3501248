package jsonrpc

import (
	"encoding/json"
	"testing"
)

func BenchmarkCall(b *testing.B) {
	params := echoParams{N: 42, Text: "the quick brown fox jumps over the lazy dog"}
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			client, _ := connPair(b, tr, nil, echo)
			b.ReportAllocs()
			var got echoParams
			for b.Loop() {
				if err := client.Call(b.Context(), "echo", params, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tr.name+"/parallel", func(b *testing.B) {
			client, _ := connPair(b, tr, nil, echo)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var got echoParams
				for pb.Next() {
					if err := client.Call(b.Context(), "echo", params, &got); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkDecodeMessage(b *testing.B) {
	frame := []byte(`{"jsonrpc":"2.0","id":12,"method":"session/update","params":{"sessionId":"s-1","update":{"type":"content","data":{"text":"hello, world"}}}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := DecodeMessage(frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeRequest(b *testing.B) {
	req := &Request{ID: Int64ID(12), Method: "session/update", Params: json.RawMessage(`{"sessionId":"s-1"}`)}
	b.ReportAllocs()
	buf := make([]byte, 0, 256)
	for b.Loop() {
		buf = appendRequest(buf[:0], req)
	}
}
