module github.com/conclave-ai/conclave/services/bus

go 1.26.8
