package auth_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
)

func TestAgentTokens(t *testing.T) {
	t.Parallel()
	pairs := []string{"alpha=a-secret-0123456789", " beta = b-secret-0123456789 "}
	tests := []struct {
		name     string
		required bool
		agentID  string
		header   string
		want     codes.Code
	}{
		{"own token", true, "alpha", "Bearer a-secret-0123456789", codes.OK},
		{"trimmed pair", true, "beta", "Bearer b-secret-0123456789", codes.OK},
		{"another agent's token", true, "beta", "Bearer a-secret-0123456789", codes.Unauthenticated},
		{"no token", true, "alpha", "", codes.Unauthenticated},
		{"not a bearer token", true, "alpha", "Basic a-secret-0123456789", codes.Unauthenticated},
		{"unknown agent, required", true, "gamma", "Bearer a-secret-0123456789", codes.PermissionDenied},
		{"unknown agent, optional", false, "gamma", "", codes.OK},
		{"known agent, optional, no token", false, "alpha", "", codes.Unauthenticated},
		{"known agent, optional, wrong token", false, "alpha", "Bearer b-secret-0123456789", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tokens, err := auth.ParseAgentTokens(pairs, tt.required)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.header != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", tt.header))
			}
			err = tokens.Check(ctx, tt.agentID)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("Check = %v, want %v", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("error reveals a token: %v", err)
			}
		})
	}
}

func TestParseAgentTokensRejects(t *testing.T) {
	t.Parallel()
	for _, pairs := range [][]string{{"alpha"}, {"=xxxxxxxxxxxxxxxxxxxxx"}, {"alpha="}, {"alpha=short-token"}, {"alpha=qqqqqqqqqqqqqqqqqq", "alpha=zzzzzzzzzzzzzzzzzz"}} {
		_, err := auth.ParseAgentTokens(pairs, true)
		if err == nil {
			t.Errorf("%q: accepted", pairs)
			continue
		}
		for _, p := range pairs {
			if _, tok, _ := strings.Cut(p, "="); tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("%q: error %q reveals a token", pairs, err)
			}
		}
	}
}
