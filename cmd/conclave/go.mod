module github.com/conclave-ai/conclave/cmd/conclave

go 1.26.8
