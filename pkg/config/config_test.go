package config_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
)

type testConfig struct {
	config.Common
	Storage  config.Storage
	GRPCAddr config.ListenAddr `env:"CONCLAVE_TEST_GRPC_ADDR" default:":50051" help:"gRPC listen address"`
	Replicas int               `env:"CONCLAVE_TEST_REPLICAS" default:"1"`
	Rate     float64           `env:"CONCLAVE_TEST_RATE" default:"0.5"`
	Open     bool              `env:"CONCLAVE_TEST_OPEN" default:"false" help:"open to everyone"`
	Wait     time.Duration     `env:"CONCLAVE_TEST_WAIT" default:"15s" help:"how long to wait"`
	Tokens   []string          `env:"CONCLAVE_TEST_TOKENS" help:"accepted tokens"`
}

func lookup(m map[string]string) config.Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(*testing.T, testConfig)
		wantErr []string // every substring must appear in the error
	}{
		{
			name: "defaults",
			check: func(t *testing.T, c testConfig) {
				if c.GRPCAddr != ":50051" || c.Replicas != 1 || c.Storage.Backend != config.BackendEmbedded ||
					c.LogFormat != "json" || c.LogLevel != "info" || c.Storage.DataDir != ".conclave" {
					t.Errorf("defaults not applied: %+v", c)
				}
			},
		},
		{
			name: "env",
			env:  map[string]string{"CONCLAVE_TEST_GRPC_ADDR": "127.0.0.1:9", "CONCLAVE_BACKEND": "AWS", "OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317"},
			check: func(t *testing.T, c testConfig) {
				if c.GRPCAddr != "127.0.0.1:9" || c.Storage.Backend != config.BackendAWS || c.OTLPEndpoint != "localhost:4317" {
					t.Errorf("env not applied: %+v", c)
				}
			},
		},
		{
			name: "flag wins over env",
			args: []string{"--test-grpc-addr", ":7000", "-log-format=text"},
			env:  map[string]string{"CONCLAVE_TEST_GRPC_ADDR": ":6000"},
			check: func(t *testing.T, c testConfig) {
				if c.GRPCAddr != ":7000" || c.LogFormat != "text" {
					t.Errorf("flags not applied: %+v", c)
				}
			},
		},
		{name: "port not a number", env: map[string]string{"CONCLAVE_TEST_GRPC_ADDR": ":http"}, wantErr: []string{"CONCLAVE_TEST_GRPC_ADDR", `port "http"`}},
		{name: "port out of range", args: []string{"--test-grpc-addr=:70000"}, wantErr: []string{"CONCLAVE_TEST_GRPC_ADDR", "70000"}},
		{name: "not host:port", env: map[string]string{"CONCLAVE_TEST_GRPC_ADDR": "50051"}, wantErr: []string{"CONCLAVE_TEST_GRPC_ADDR", "host:port"}},
		{name: "unknown backend", env: map[string]string{"CONCLAVE_BACKEND": "postgres"}, wantErr: []string{"CONCLAVE_BACKEND", `unknown backend "postgres"`}},
		{name: "int not a number", env: map[string]string{"CONCLAVE_TEST_REPLICAS": "three"}, wantErr: []string{"CONCLAVE_TEST_REPLICAS"}},
		{
			name: "float flag",
			args: []string{"--test-rate=2.25"},
			check: func(t *testing.T, c testConfig) {
				if c.Rate != 2.25 {
					t.Errorf("float flag not applied: %v", c.Rate)
				}
			},
		},
		{
			name: "float default",
			check: func(t *testing.T, c testConfig) {
				if c.Rate != 0.5 {
					t.Errorf("float default not applied: %v", c.Rate)
				}
			},
		},
		{name: "float from env", env: map[string]string{"CONCLAVE_TEST_RATE": "1e-3"}, check: func(t *testing.T, c testConfig) {
			if c.Rate != 0.001 {
				t.Errorf("float env not applied: %v", c.Rate)
			}
		}},
		{name: "float not a number", env: map[string]string{"CONCLAVE_TEST_RATE": "fast"}, wantErr: []string{"CONCLAVE_TEST_RATE", `"fast" is not a number`}},
		{name: "bad log format", env: map[string]string{"CONCLAVE_LOG_FORMAT": "xml"}, wantErr: []string{"CONCLAVE_LOG_FORMAT", "xml"}},
		{name: "bad log level", args: []string{"--log-level=loud"}, wantErr: []string{"CONCLAVE_LOG_LEVEL"}},
		{name: "bare boolean flag", args: []string{"--test-open"}, check: func(t *testing.T, c testConfig) {
			if !c.Open {
				t.Error("--test-open did not set the boolean")
			}
		}},
		{name: "boolean flag with a value", args: []string{"--test-open=false", "--test-wait", "2m"}, env: map[string]string{"CONCLAVE_TEST_OPEN": "true"}, check: func(t *testing.T, c testConfig) {
			if c.Open || c.Wait != 2*time.Minute {
				t.Errorf("flags not applied: open=%v wait=%v", c.Open, c.Wait)
			}
		}},
		{name: "boolean flag not a boolean", args: []string{"--test-open=maybe"}, wantErr: []string{"CONCLAVE_TEST_OPEN", `"maybe" is not true or false`}},
		{name: "duration flag not a duration", args: []string{"--test-wait=soon"}, wantErr: []string{"CONCLAVE_TEST_WAIT", "duration"}},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: []string{"nope"}},
		{name: "stray argument", args: []string{"extra"}, wantErr: []string{`unexpected argument "extra"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c testConfig
			err := config.Load(context.Background(), &c, "test", tt.args, lookup(tt.env), io.Discard)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Load succeeded, want an error naming %v", tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error spans lines: %q", err)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			tt.check(t, c)
		})
	}
}

func TestLoadHelp(t *testing.T) {
	t.Parallel()
	var c testConfig
	var usage strings.Builder
	err := config.Load(context.Background(), &c, "test", []string{"-h"}, lookup(nil), &usage)
	if !errors.Is(err, config.ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, want := range []string{
		"--test-grpc-addr host:port\n", "gRPC listen address (env CONCLAVE_TEST_GRPC_ADDR, default :50051)",
		"--test-open\n", "open to everyone (env CONCLAVE_TEST_OPEN, default false)",
		"--test-wait duration\n", "(env CONCLAVE_TEST_WAIT, default 15s)",
		"--test-replicas int\n", "--test-rate float\n", "--test-tokens list\n", "--backend embedded|aws\n",
		"--otel-exporter-otlp-endpoint string\n",
	} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, usage.String())
		}
	}
}

// A value set before Load (conclave dev's loopback addresses, its open
// client API) is the default -h shows.
func TestLoadHelpShowsPresets(t *testing.T) {
	t.Parallel()
	c := testConfig{Open: true, GRPCAddr: "127.0.0.1:1", Wait: time.Second}
	var usage strings.Builder
	if err := config.Load(context.Background(), &c, "test", []string{"--help"}, lookup(nil), &usage); !errors.Is(err, config.ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, want := range []string{"CONCLAVE_TEST_OPEN, default true)", "CONCLAVE_TEST_GRPC_ADDR, default 127.0.0.1:1)", "CONCLAVE_TEST_WAIT, default 1s)"} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, usage.String())
		}
	}
}

func TestLoadRejectsNonStruct(t *testing.T) {
	t.Parallel()
	var n int
	if err := config.Load(context.Background(), &n, "test", nil, lookup(nil), io.Discard); err == nil {
		t.Fatal("Load accepted a non-struct target")
	}
}

func TestFlagName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"CONCLAVE_GATEWAY_GRPC_ADDR":  "gateway-grpc-addr",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-exporter-otlp-endpoint",
		"AWS_REGION":                  "aws-region",
	} {
		if got := config.FlagName(in); got != want {
			t.Errorf("FlagName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLoadSharedKeysAndPresetDefaults(t *testing.T) {
	t.Parallel()
	type all struct {
		A testConfig
		B testConfig
	}
	var c all
	c.B.GRPCAddr = "127.0.0.1:1"
	err := config.Load(context.Background(), &c, "test", []string{"--log-level=debug"}, lookup(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.A.LogLevel != "debug" || c.B.LogLevel != "debug" {
		t.Errorf("shared flag did not reach both structs: %q %q", c.A.LogLevel, c.B.LogLevel)
	}
	if c.A.GRPCAddr != ":50051" || c.B.GRPCAddr != "127.0.0.1:1" {
		t.Errorf("preset value overwritten or default missing: %q %q", c.A.GRPCAddr, c.B.GRPCAddr)
	}
}
