package testenv_test

import (
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

func TestServingGRPCAddr(t *testing.T) {
	t.Parallel()
	tests := []struct{ line, want string }{
		{`{"level":"INFO","msg":"serving","server":"gateway","grpc_addr":"127.0.0.1:40467","http_addr":"127.0.0.1:40819"}`, "127.0.0.1:40467"},
		{`{"level":"INFO","msg":"serving","server":"librarian","grpc_addr":"","http_addr":"127.0.0.1:8081"}`, ""},
		{`{"level":"INFO","msg":"draining","grpc_addr":"127.0.0.1:1"}`, ""},
		{`not json`, ""},
	}
	for _, tt := range tests {
		if got := testenv.ServingGRPCAddr([]byte(tt.line)); got != tt.want {
			t.Errorf("ServingGRPCAddr(%s) = %q, want %q", tt.line, got, tt.want)
		}
	}
}

func TestServingAddrs(t *testing.T) {
	t.Parallel()
	g, h, ok := testenv.ServingAddrs([]byte(`{"level":"INFO","msg":"serving","server":"bus","grpc_addr":"","http_addr":"127.0.0.1:7892"}`))
	if !ok || g != "" || h != "127.0.0.1:7892" {
		t.Errorf("ServingAddrs = %q, %q, %v", g, h, ok)
	}
	if _, _, ok := testenv.ServingAddrs([]byte(`{"msg":"draining"}`)); ok {
		t.Error("a line other than serving")
	}
}
