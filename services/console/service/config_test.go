package service

import (
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	return Config{HTTPAddr: "127.0.0.1:0", GatewayURL: "http://127.0.0.1:8080", BusURL: "ws://127.0.0.1:7892",
		RunnerURL: "http://127.0.0.1:8082", LibrarianURL: "http://127.0.0.1:8081", SessionTTL: time.Hour,
		BackendTimeout: time.Second, ChatTimeout: time.Minute, RefreshInterval: time.Second, MaxStreams: 10,
		StreamMaxAge: time.Minute, ShutdownTimeout: time.Second}
}

func TestValidateNamesTheBadSetting(t *testing.T) {
	t.Parallel()
	const secret = "c2VjcmV0LXZhbHVlLXRoYXQtaXMtbm90LTMyLWJ5dGVz"
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"a good one", func(*Config) {}, ""},
		{"a session key of the wrong size", func(c *Config) { c.SessionKey = secret }, "CONCLAVE_CONSOLE_SESSION_KEY"},
		{"a session key that is not base64", func(c *Config) { c.SessionKey = "not base64!" }, "CONCLAVE_CONSOLE_SESSION_KEY"},
		{"a gateway URL without a host", func(c *Config) { c.GatewayURL = "http://" }, "CONCLAVE_CONSOLE_GATEWAY_URL"},
		{"a bus URL that is http", func(c *Config) { c.BusURL = "http://127.0.0.1:7892" }, "CONCLAVE_CONSOLE_BUS_URL"},
		{"a Jaeger URL that is not a URL", func(c *Config) { c.JaegerURL = "jaeger" }, "CONCLAVE_CONSOLE_JAEGER_URL"},
		{"a Jaeger query URL over another scheme", func(c *Config) { c.JaegerQueryURL = "ftp://jaeger:16686" }, "CONCLAVE_CONSOLE_JAEGER_QUERY_URL"},
		{"a zero session lifetime", func(c *Config) { c.SessionTTL = 0 }, "CONCLAVE_CONSOLE_SESSION_TTL"},
		{"no streams", func(c *Config) { c.MaxStreams = 0 }, "CONCLAVE_CONSOLE_MAX_STREAMS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tt.change(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %s", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error repeats the secret: %v", err)
			}
		})
	}
}

func TestSessionKeyDecodes(t *testing.T) {
	t.Parallel()
	c := validConfig()
	c.SessionKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes
	key, err := c.sessionKey()
	if err != nil || string(key) != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("%q %v", key, err)
	}
}
