package config_test

import (
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
)

// positiveConfig has a setting of each kind the "positive" rule takes, in
// a nested untagged struct too.
type positiveConfig struct {
	Count  int           `env:"CONCLAVE_TEST_COUNT" default:"1" validate:"positive"`
	Bytes  int64         `env:"CONCLAVE_TEST_BYTES" default:"1024" validate:"positive"`
	Rate   float64       `env:"CONCLAVE_TEST_RATE" default:"0.5" validate:"positive"`
	Wait   time.Duration `env:"CONCLAVE_TEST_WAIT" default:"1s" validate:"positive"`
	Free   int           `env:"CONCLAVE_TEST_FREE" default:"0"`
	Nested struct {
		Lease time.Duration `env:"CONCLAVE_TEST_LEASE" default:"15s" validate:"positive"`
	}
}

func TestPositive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" for none; else the error's text after "invalid setting "
	}{
		{name: "defaults", env: nil},
		{name: "a setting without the rule may be zero", env: map[string]string{"CONCLAVE_TEST_FREE": "-3"}},
		{name: "int zero", env: map[string]string{"CONCLAVE_TEST_COUNT": "0"}, wantErr: "CONCLAVE_TEST_COUNT: must be positive, got 0"},
		{name: "int negative", env: map[string]string{"CONCLAVE_TEST_COUNT": "-1"}, wantErr: "CONCLAVE_TEST_COUNT: must be positive, got -1"},
		{name: "int64 zero", env: map[string]string{"CONCLAVE_TEST_BYTES": "0"}, wantErr: "CONCLAVE_TEST_BYTES: must be positive, got 0"},
		{name: "float zero", env: map[string]string{"CONCLAVE_TEST_RATE": "0"}, wantErr: "CONCLAVE_TEST_RATE: must be positive, got 0"},
		{name: "float negative", env: map[string]string{"CONCLAVE_TEST_RATE": "-0.5"}, wantErr: "CONCLAVE_TEST_RATE: must be positive, got -0.5"},
		{name: "float NaN", env: map[string]string{"CONCLAVE_TEST_RATE": "NaN"}, wantErr: "CONCLAVE_TEST_RATE: must be positive, got NaN"},
		{name: "float tiny", env: map[string]string{"CONCLAVE_TEST_RATE": "1e-300"}},
		{name: "duration zero", env: map[string]string{"CONCLAVE_TEST_WAIT": "0s"}, wantErr: "CONCLAVE_TEST_WAIT: must be positive, got 0s"},
		{name: "duration negative", env: map[string]string{"CONCLAVE_TEST_WAIT": "-5m"}, wantErr: "CONCLAVE_TEST_WAIT: must be positive, got -5m0s"},
		{name: "duration one nanosecond", env: map[string]string{"CONCLAVE_TEST_WAIT": "1ns"}},
		{name: "nested", env: map[string]string{"CONCLAVE_TEST_LEASE": "0s"}, wantErr: "CONCLAVE_TEST_LEASE: must be positive, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c positiveConfig
			err := config.Load(context.Background(), &c, "test", nil, lookup(tt.env), io.Discard)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Load: %v", err)
			case tt.wantErr != "" && (err == nil || err.Error() != "invalid setting "+tt.wantErr):
				t.Fatalf("Load = %v, want invalid setting %s", err, tt.wantErr)
			}
			// Check holds a struct built in code to the same rule, with the
			// same message.
			err = config.Check(c)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr) {
				t.Fatalf("Check = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheckMisuse(t *testing.T) {
	t.Parallel()
	var onString struct {
		Name string `env:"CONCLAVE_TEST_NAME" validate:"positive"`
	}
	var unknownRule struct {
		N int `env:"CONCLAVE_TEST_N" validate:"even"`
	}
	n := 1
	for name, tt := range map[string]struct {
		target any
		want   string
	}{
		"positive on a string": {&onString, "CONCLAVE_TEST_NAME: validate:\"positive\" on a string"},
		"unknown rule":         {unknownRule, `CONCLAVE_TEST_N: unknown validate rule "even"`},
		"not a struct":         {&n, "Check needs a struct"},
	} {
		if err := config.Check(tt.target); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Check = %v, want an error containing %q", name, err, tt.want)
		}
	}
}

// FuzzPositive: whatever text a positive setting is given, Load either
// refuses it with an error naming the key, or accepts a value above zero.
func FuzzPositive(f *testing.F) {
	for _, s := range []string{"1", "0", "-1", "1e-300", "NaN", "+Inf", "-Inf", "9223372036854775807", "-9223372036854775808", "1s", "0s", "-1ns", "", " 3", "0x10"} {
		f.Add(s, s, s)
	}
	f.Add("3", "0.25", "10s")
	f.Fuzz(func(t *testing.T, count, rate, wait string) {
		var c positiveConfig
		err := config.Load(context.Background(), &c, "test", nil, lookup(map[string]string{
			"CONCLAVE_TEST_COUNT": count, "CONCLAVE_TEST_RATE": rate, "CONCLAVE_TEST_WAIT": wait,
		}), io.Discard)
		if err != nil {
			if !strings.Contains(err.Error(), "CONCLAVE_TEST_COUNT") && !strings.Contains(err.Error(), "CONCLAVE_TEST_RATE") &&
				!strings.Contains(err.Error(), "CONCLAVE_TEST_WAIT") {
				t.Fatalf("error names no setting: %v", err)
			}
			return
		}
		if c.Count <= 0 || !(c.Rate > 0) || c.Wait <= 0 {
			t.Fatalf("accepted count %d, rate %g, wait %s", c.Count, c.Rate, c.Wait)
		}
		if n, err := strconv.Atoi(count); err != nil || n != c.Count {
			t.Fatalf("count %q loaded as %d", count, c.Count)
		}
		if d, err := time.ParseDuration(wait); err != nil || d != c.Wait {
			t.Fatalf("wait %q loaded as %s", wait, c.Wait)
		}
	})
}
