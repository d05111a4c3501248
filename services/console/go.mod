module github.com/conclave-ai/conclave/services/console

go 1.26.8

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/coder/websocket v1.8.15
	github.com/conclave-ai/conclave/pkg v0.0.0-00010101000000-000000000000
	github.com/conclave-ai/conclave/proto v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	google.golang.org/protobuf v1.36.12
)

replace (
	github.com/conclave-ai/conclave/pkg => ../../pkg
	github.com/conclave-ai/conclave/proto => ../../proto
)
