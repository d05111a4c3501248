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

func TestClientID(t *testing.T) {
	t.Parallel()
	unary, stream := auth.NewTokens("s3cret", "other").Protect("/conclave.gateway.v1.")
	withToken := func(tok string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	}
	// sha256("s3cret") begins 1ec1c26b50d5d3c5; the ID is those 16 hex digits.
	const s3cretID = "token:1ec1c26b50d5d3c5"
	tests := []struct {
		name   string
		ctx    context.Context
		method string
		want   string
	}{
		{"accepted token", withToken("s3cret"), "/conclave.gateway.v1.GatewayService/ListAgents", s3cretID},
		{"another accepted token", withToken("other"), "/conclave.gateway.v1.GatewayService/ListAgents", auth.TokenID("other")},
		// An unguarded method's token is never checked, so it names no one.
		{"unchecked token", withToken("made-up"), "/grpc.health.v1.Health/Check", auth.Anonymous},
		{"no token, unguarded", context.Background(), "/grpc.health.v1.Health/Check", auth.Anonymous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got string
			_, err := unary(tt.ctx, nil, &grpc.UnaryServerInfo{FullMethod: tt.method}, func(ctx context.Context, _ any) (any, error) {
				got = auth.ClientID(ctx)
				return nil, nil
			})
			if err != nil || got != tt.want {
				t.Errorf("unary: ClientID = %q (%v), want %q", got, err, tt.want)
			}
			got = ""
			err = stream(nil, fakeStream{ctx: tt.ctx}, &grpc.StreamServerInfo{FullMethod: tt.method}, func(_ any, ss grpc.ServerStream) error {
				got = auth.ClientID(ss.Context())
				return nil
			})
			if err != nil || got != tt.want {
				t.Errorf("stream: ClientID = %q (%v), want %q", got, err, tt.want)
			}
		})
	}
	if id := auth.TokenID("s3cret"); id != s3cretID || auth.TokenID("other") == id {
		t.Errorf("TokenID(s3cret) = %q; want %q, distinct from other tokens'", id, s3cretID)
	}
	if id := auth.ClientID(context.Background()); id != auth.Anonymous {
		t.Errorf("a context Protect never saw has ClientID %q, want %q", id, auth.Anonymous)
	}
}
