module github.com/conclave-ai/conclave/services/bridge

go 1.26.8
