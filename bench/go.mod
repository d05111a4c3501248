module github.com/conclave-ai/conclave/bench

go 1.26.8

require github.com/sourcegraph/jsonrpc2 v0.2.3 // indirect
