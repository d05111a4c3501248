module github.com/conclave-ai/conclave/examples/coven-agent

go 1.26.8

require (
	github.com/conclave-ai/conclave/proto v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.85.0
)

require (
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/conclave-ai/conclave/proto => ../../proto
