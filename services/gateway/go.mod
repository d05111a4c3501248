module github.com/conclave-ai/conclave/services/gateway

go 1.26.8
