package auth_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	tokens := auth.NewTokens("alpha", "", "beta")
	tests := []struct {
		header string
		want   codes.Code
	}{
		{"Bearer alpha", codes.OK},
		{"bearer beta", codes.OK},
		{"Bearer  beta ", codes.OK},
		{"Bearer gamma", codes.Unauthenticated},
		{"Bearer ", codes.Unauthenticated},
		{"Basic alpha", codes.Unauthenticated},
		{"alpha", codes.Unauthenticated},
		{"", codes.Unauthenticated},
	}
	for _, tt := range tests {
		ctx := context.Background()
		if tt.header != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", tt.header))
		}
		if got := status.Code(tokens.Check(ctx)); got != tt.want {
			t.Errorf("%q: %v, want %v", tt.header, got, tt.want)
		}
	}
	if auth.NewTokens().Valid("") || !auth.NewTokens().Empty() {
		t.Error("an empty set accepted the empty token")
	}
}

func TestProtect(t *testing.T) {
	t.Parallel()
	unary, stream := auth.NewTokens("s3cret").Protect("/conclave.gateway.v1.")
	ok := func(context.Context, any) (any, error) { return "ran", nil }
	anon := context.Background()
	if _, err := unary(anon, nil, &grpc.UnaryServerInfo{FullMethod: "/conclave.gateway.v1.GatewayService/ListAgents"}, ok); status.Code(err) != codes.Unauthenticated {
		t.Errorf("guarded method without token: %v", err)
	}
	if got, err := unary(anon, nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}, ok); err != nil || got != "ran" {
		t.Errorf("unguarded method: %v %v", got, err)
	}
	authed := metadata.NewIncomingContext(anon, metadata.Pairs("authorization", "Bearer s3cret"))
	if got, err := unary(authed, nil, &grpc.UnaryServerInfo{FullMethod: "/conclave.gateway.v1.GatewayService/ListAgents"}, ok); err != nil || got != "ran" {
		t.Errorf("guarded method with token: %v %v", got, err)
	}
	err := stream(nil, fakeStream{ctx: anon}, &grpc.StreamServerInfo{FullMethod: "/conclave.gateway.v1.GatewayService/SendMessage"},
		func(any, grpc.ServerStream) error { return nil })
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("guarded stream without token: %v", err)
	}
}

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }
