package config

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"

	clog "github.com/conclave-ai/conclave/pkg/log"
)

// ListenAddr is a host:port to listen on. Its port must be a number from 0 to
// 65535; an empty value means the listener is disabled.
type ListenAddr string

// EnvDecode implements Decoder.
func (a *ListenAddr) EnvDecode(val string) error {
	if val == "" {
		*a = ""
		return nil
	}
	_, port, err := net.SplitHostPort(val)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", val, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q in %q is not a number from 0 to 65535", port, val)
	}
	*a = ListenAddr(val)
	return nil
}

func (a ListenAddr) String() string { return string(a) }

// FlagType implements FlagTyper.
func (*ListenAddr) FlagType() string { return "host:port" }

// StoreBackend names where a service keeps its state and queues.
type StoreBackend string

const (
	// BackendEmbedded is one local file: conclave dev and single-node use.
	BackendEmbedded StoreBackend = "embedded"
	// BackendAWS is DynamoDB and SQS through aws-sdk-go-v2.
	BackendAWS StoreBackend = "aws"
)

var backends = []StoreBackend{BackendEmbedded, BackendAWS}

// EnvDecode implements Decoder.
func (b *StoreBackend) EnvDecode(val string) error {
	v := StoreBackend(strings.ToLower(strings.TrimSpace(val)))
	if !slices.Contains(backends, v) {
		return fmt.Errorf("unknown backend %q (want one of %v)", val, backends)
	}
	*b = v
	return nil
}

// FlagType implements FlagTyper.
func (*StoreBackend) FlagType() string { return "embedded|aws" }

// Common holds the settings every deployable shares.
type Common struct {
	LogLevel     string `env:"CONCLAVE_LOG_LEVEL" default:"info" help:"log level: debug, info, warn or error"`
	LogFormat    string `env:"CONCLAVE_LOG_FORMAT" default:"json" help:"log format: json (production) or text (development)"`
	OTLPEndpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT" help:"OTLP endpoint for traces and metrics (host:port over gRPC for the services; an http:// URL over OTLP/HTTP for the Librarian Lambda); tracing is off when empty"`
	OTLPInsecure bool   `env:"OTEL_EXPORTER_OTLP_INSECURE" default:"true" help:"send OTLP without TLS"`
}

// Storage selects and locates the store and queue backends.
type Storage struct {
	Backend     StoreBackend `env:"CONCLAVE_BACKEND" default:"embedded" help:"state backend: embedded or aws"`
	DataDir     string       `env:"CONCLAVE_DATA_DIR" default:".conclave" help:"directory of the embedded store, and of the runner's records of the agent processes it starts"`
	AWSEndpoint string       `env:"CONCLAVE_AWS_ENDPOINT" help:"override the DynamoDB and SQS endpoint (dynalite, fauxqs)"`
	AWSRegion   string       `env:"AWS_REGION" default:"us-east-1" help:"AWS region"`
	// TablePrefix separates environments sharing one AWS account.
	TablePrefix string `env:"CONCLAVE_TABLE_PREFIX" default:"conclave-" help:"prefix of the DynamoDB table names (the aws backend)"`
}

// Validate checks the settings go-envconfig cannot check by type.
func (c Common) Validate() error {
	if _, err := clog.ParseFormat(c.LogFormat); err != nil {
		return fmt.Errorf("CONCLAVE_LOG_FORMAT: %w", err)
	}
	if _, err := clog.ParseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("CONCLAVE_LOG_LEVEL: %w", err)
	}
	return nil
}

// Logger builds the deployable's logger from the validated settings.
func (c Common) Logger(w io.Writer, service string) *slog.Logger {
	format, _ := clog.ParseFormat(c.LogFormat)
	level, _ := clog.ParseLevel(c.LogLevel)
	return clog.New(w, clog.Options{Format: format, Level: level, Service: service})
}
