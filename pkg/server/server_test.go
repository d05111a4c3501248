package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	tests := []struct {
		name    string
		cfg     Config
		logger  *slog.Logger
		wantErr string
	}{
		{"no name", Config{HTTPAddr: ":0"}, logger, "Name is required"},
		{"nil logger", Config{Name: "x", HTTPAddr: ":0"}, nil, "logger is nil"},
		{"no listener", Config{Name: "x"}, logger, "neither a gRPC nor an HTTP listener"},
		{"negative message size", Config{Name: "x", GRPCAddr: ":0", MaxRecvMsgSize: -1}, logger, "MaxRecvMsgSize"},
		{"negative keepalive", Config{Name: "x", GRPCAddr: ":0", Keepalive: Keepalive{Time: -1}}, logger, "Keepalive.Time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tt.cfg, tt.logger)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Config{Name: "x", ReadTimeout: -1, MaxRequestBodyBytes: -1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ShutdownTimeout != DefaultShutdownTimeout || cfg.MaxRecvMsgSize != DefaultMaxRecvMsgSize ||
		cfg.WriteTimeout != DefaultWriteTimeout || cfg.Keepalive.MinTime != DefaultKeepaliveMinTime {
		t.Errorf("zero fields not defaulted: %+v", cfg)
	}
	if cfg.ReadTimeout != 0 || cfg.MaxRequestBodyBytes != 0 {
		t.Errorf("negative fields should mean no limit (0), got ReadTimeout=%s MaxRequestBodyBytes=%d",
			cfg.ReadTimeout, cfg.MaxRequestBodyBytes)
	}
}

func checkHealth(t *testing.T, ts *testServer, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	resp, err := healthpb.NewHealthClient(ts.dial(t)).Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

func TestHealthOverGRPCAndHTTP(t *testing.T) {
	t.Parallel()
	ts := startServer(t, bothListeners(), func(s *Server) {
		s.SetServingStatus("conclave.Up", true)
		s.SetServingStatus("conclave.Down", false)
	})

	grpcTests := []struct {
		service string
		want    healthpb.HealthCheckResponse_ServingStatus
	}{
		{"", healthpb.HealthCheckResponse_SERVING},
		{"conclave.Up", healthpb.HealthCheckResponse_SERVING},
		{"conclave.Down", healthpb.HealthCheckResponse_NOT_SERVING},
	}
	for _, tt := range grpcTests {
		t.Run("grpc/"+tt.service, func(t *testing.T) {
			t.Parallel()
			got, err := checkHealth(t, ts, tt.service)
			if err != nil || got != tt.want {
				t.Errorf("Check(%q) = %v, %v; want %v", tt.service, got, err, tt.want)
			}
		})
	}
	t.Run("grpc/unknown", func(t *testing.T) {
		t.Parallel()
		if _, err := checkHealth(t, ts, "conclave.Unknown"); status.Code(err) != codes.NotFound {
			t.Errorf("Check(unknown) error = %v, want NotFound", err)
		}
	})

	httpTests := []struct {
		path       string
		wantStatus string
	}{
		{"/healthz", "ok"},
		{"/readyz", "ready"},
	}
	for _, tt := range httpTests {
		t.Run("http"+tt.path, func(t *testing.T) {
			t.Parallel()
			res := get(t, ts.url(tt.path))
			if res.err != nil || res.status != http.StatusOK {
				t.Fatalf("GET %s = %d %q, %v; want 200", tt.path, res.status, res.body, res.err)
			}
			var body statusResponse
			if err := json.Unmarshal([]byte(res.body), &body); err != nil || body.Status != tt.wantStatus {
				t.Errorf("GET %s body = %q, want status %q", tt.path, res.body, tt.wantStatus)
			}
		})
	}
}

func TestSingleProtocolServers(t *testing.T) {
	t.Parallel()
	t.Run("grpc only serves health over gRPC", func(t *testing.T) {
		t.Parallel()
		ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, nil)
		if ts.HTTPAddr() != "" {
			t.Errorf("HTTPAddr = %q, want empty", ts.HTTPAddr())
		}
		if got, err := checkHealth(t, ts, ""); err != nil || got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check = %v, %v; want SERVING", got, err)
		}
	})
	t.Run("http only", func(t *testing.T) {
		t.Parallel()
		ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, nil)
		if ts.GRPCAddr() != "" {
			t.Errorf("GRPCAddr = %q, want empty", ts.GRPCAddr())
		}
		if res := get(t, ts.url("/healthz")); res.status != http.StatusOK {
			t.Errorf("GET /healthz = %d, %v", res.status, res.err)
		}
	})
}

func TestDrainingTurnsHealthAndReadinessOff(t *testing.T) {
	t.Parallel()
	type observed struct {
		grpcStatus healthpb.HealthCheckResponse_ServingStatus
		grpcErr    error
		readyz     httpResult
		healthz    httpResult
	}
	seen := make(chan observed, 1)
	var (
		healthClient healthpb.HealthClient
		readyzURL    string
		healthzURL   string
	)
	ts := startServer(t, bothListeners(), func(s *Server) {
		s.SetServingStatus("conclave.Svc", true)
		// Hooks run after draining begins and before the listeners close,
		// which is exactly when a load balancer probes and must be told no.
		s.OnShutdown(func(ctx context.Context) {
			var o observed
			resp, err := healthClient.Check(ctx, &healthpb.HealthCheckRequest{Service: "conclave.Svc"})
			o.grpcStatus, o.grpcErr = resp.GetStatus(), err
			o.readyz = get(t, readyzURL)
			o.healthz = get(t, healthzURL)
			// Nothing may turn a draining server back to SERVING.
			s.SetServingStatus("conclave.Svc", true)
			seen <- o
		})
	})
	healthClient = healthpb.NewHealthClient(ts.dial(t))
	readyzURL, healthzURL = ts.url("/readyz"), ts.url("/healthz")

	if err := ts.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	o := <-seen
	if o.grpcErr != nil || o.grpcStatus != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while draining = %v, %v; want NOT_SERVING", o.grpcStatus, o.grpcErr)
	}
	if o.readyz.status != http.StatusServiceUnavailable || !strings.Contains(o.readyz.body, `"draining"`) {
		t.Errorf("/readyz while draining = %d %q, want 503 draining", o.readyz.status, o.readyz.body)
	}
	if o.healthz.status != http.StatusOK {
		t.Errorf("/healthz while draining = %d, want 200: liveness must not fail during a drain", o.healthz.status)
	}
}

func TestReadiness(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) error { return nil }
	fail := func(context.Context) error { return errors.New("connection refused") }
	tests := []struct {
		name       string
		checks     map[string]func(context.Context) error
		wantStatus int
		wantFailed []string
	}{
		{"no checks", nil, http.StatusOK, nil},
		{"all pass", map[string]func(context.Context) error{"store": ok, "queue": ok}, http.StatusOK, nil},
		{"one fails", map[string]func(context.Context) error{"store": ok, "queue": fail}, http.StatusServiceUnavailable, []string{"queue"}},
		{"several fail", map[string]func(context.Context) error{"store": fail, "queue": fail, "cache": ok}, http.StatusServiceUnavailable, []string{"queue", "store"}},
		{"panicking check fails", map[string]func(context.Context) error{"store": func(context.Context) error { panic("boom") }}, http.StatusServiceUnavailable, []string{"store"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
				for name, check := range tt.checks {
					s.AddReadinessCheck(name, check)
				}
			})
			res := get(t, ts.url("/readyz"))
			if res.err != nil || res.status != tt.wantStatus {
				t.Fatalf("GET /readyz = %d %q, %v; want %d", res.status, res.body, res.err, tt.wantStatus)
			}
			var body statusResponse
			if err := json.Unmarshal([]byte(res.body), &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", res.body, err)
			}
			if !slices.Equal(body.Failed, tt.wantFailed) {
				t.Errorf("failed checks = %v, want %v", body.Failed, tt.wantFailed)
			}
			for _, name := range tt.wantFailed {
				if !strings.Contains(ts.logs.String(), "check="+name) {
					t.Errorf("failing check %q not logged; logs:\n%s", name, ts.logs)
				}
			}
		})
	}
}

func TestAddReadinessCheckRejectsDuplicates(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Name: "x", HTTPAddr: ":0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.AddReadinessCheck("store", func(context.Context) error { return nil })
	defer func() {
		if recover() == nil {
			t.Error("duplicate readiness check name did not panic")
		}
	}()
	s.AddReadinessCheck("store", func(context.Context) error { return nil })
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	t.Run("default is Prometheus with Go runtime metrics", func(t *testing.T) {
		t.Parallel()
		ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, nil)
		res := get(t, ts.url("/metrics"))
		if res.status != http.StatusOK || !strings.Contains(res.body, "go_goroutines") {
			t.Errorf("GET /metrics = %d, body without go_goroutines:\n%.500s", res.status, res.body)
		}
	})
	t.Run("overridden", func(t *testing.T) {
		t.Parallel()
		custom := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("custom_metric 1\n")) })
		ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, nil, WithMetricsHandler(custom))
		if res := get(t, ts.url("/metrics")); res.body != "custom_metric 1\n" {
			t.Errorf("GET /metrics = %q, want the custom handler's output", res.body)
		}
	})
}

func TestReflectionListsServices(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, func(s *Server) {
		registerTestService(s, &testService{unary: echo})
	})
	stream, err := reflectionpb.NewServerReflectionClient(ts.dial(t)).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	for _, want := range []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", testServiceName} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
}

func TestAddressInUseNamesTheAddress(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  func(addr string) Config
	}{
		{"grpc", func(addr string) Config { return Config{Name: "x", GRPCAddr: addr, HTTPAddr: "127.0.0.1:0"} }},
		{"http", func(addr string) Config { return Config{Name: "x", GRPCAddr: "127.0.0.1:0", HTTPAddr: addr} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = taken.Close() }()
			addr := taken.Addr().String()

			s, err := New(tt.cfg(addr), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			err = s.Run(t.Context())
			if err == nil || !strings.Contains(err.Error(), addr) {
				t.Fatalf("Run error = %v, want one naming %s", err, addr)
			}
			select {
			case <-s.Ready():
				t.Error("Ready closed although binding failed")
			default:
			}
		})
	}
}

func TestHandedOverListeners(t *testing.T) {
	t.Parallel()
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{}, nil, WithGRPCListener(grpcLis), WithHTTPListener(httpLis))
	if ts.GRPCAddr() != grpcLis.Addr().String() || ts.HTTPAddr() != httpLis.Addr().String() {
		t.Errorf("addresses = %s, %s; want the handed-over %s, %s",
			ts.GRPCAddr(), ts.HTTPAddr(), grpcLis.Addr(), httpLis.Addr())
	}
	if got, err := checkHealth(t, ts, ""); err != nil || got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check = %v, %v; want SERVING", got, err)
	}
	if res := get(t, ts.url("/healthz")); res.status != http.StatusOK {
		t.Errorf("GET /healthz = %d, %v", res.status, res.err)
	}
}

func TestRunTwiceFails(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, nil)
	if err := ts.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "more than once") {
		t.Errorf("second Run = %v, want an error", err)
	}
}
