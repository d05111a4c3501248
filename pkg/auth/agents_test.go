package auth_test

import (
	"context"
	"slices"
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
		{"pattern's token", true, "run-42", "Bearer r-secret-0123456789", codes.OK},
		{"longest pattern wins", true, "run-x-1", "Bearer x-secret-0123456789", codes.OK},
		{"shorter pattern's token for a longer one's id", true, "run-x-1", "Bearer r-secret-0123456789", codes.Unauthenticated},
		{"catch-all", true, "anything", "Bearer any-secret-0123456789", codes.OK},
		{"catch-all's token cannot open a listed agent", true, "alpha", "Bearer any-secret-0123456789", codes.Unauthenticated},
		{"pattern's token cannot open a listed agent", true, "beta", "Bearer r-secret-0123456789", codes.Unauthenticated},
		{"a pattern's own name is not an agent", true, "run-*", "Bearer r-secret-0123456789", codes.OK},
		{"no token for a pattern's id", true, "run-42", "", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			all := pairs
			if strings.HasPrefix(tt.name, "pattern") || strings.Contains(tt.name, "pattern") || strings.Contains(tt.name, "catch-all") {
				all = append(slices.Clone(pairs), "run-*=r-secret-0123456789", "run-x-*=x-secret-0123456789", "*=any-secret-0123456789")
			}
			tokens, err := auth.ParseAgentTokens(all, tt.required)
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
	for _, pairs := range [][]string{{"alpha"}, {"=xxxxxxxxxxxxxxxxxxxxx"}, {"alpha="}, {"alpha=short-token"}, {"alpha=qqqqqqqqqqqqqqqqqq", "alpha=zzzzzzzzzzzzzzzzzz"}, {"a*b*=qqqqqqqqqqqqqqqqqq"}} {
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
