package lambdafn

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestInitWithoutCredentialsNamesThem: the Lambda does not fall back to the
// SDK's default chain, so a run without the execution role's credentials
// in the environment must stop at init and say which variables are missing.
func TestInitWithoutCredentialsNamesThem(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
	}{
		{name: "none", env: map[string]string{}},
		{name: "no secret", env: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"}},
		{name: "no key id", env: map[string]string{"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"CONCLAVE_BACKEND": "aws", "CONCLAVE_AWS_ENDPOINT": "http://127.0.0.1:1"}
			for k, v := range tt.env {
				env[k] = v
			}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			_, _, err := Init(context.Background(), lookup, io.Discard)
			if err == nil {
				t.Fatal("Init succeeded without credentials")
			}
			for _, want := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "cmd/local"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cr3t-value") {
				t.Errorf("error %q shows the secret", err)
			}
		})
	}
}

// TestInitRefusesBadOTLPSettings: a mistyped OTLP setting stops init with
// the variable's name, and never with a header's value (a credential).
func TestInitRefusesBadOTLPSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ key, value string }{
		{"OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cr3t-value%zz"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "no pair s3cr3t-value"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "10s"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"},
	} {
		env := map[string]string{"CONCLAVE_BACKEND": "aws", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", tt.key: tt.value}
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		_, _, err := Init(context.Background(), lookup, io.Discard)
		if err == nil {
			t.Errorf("%s=%q accepted", tt.key, tt.value)
			continue
		}
		if !strings.Contains(err.Error(), tt.key) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s=%q: error %q should name the key and not show the value", tt.key, tt.value, err)
		}
	}
}
